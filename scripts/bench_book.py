"""Throughput of the order-book pipeline: messages/s for book rebuild, and rebuild + features.

    python scripts/bench_book.py                 # the shared ES MBO day and the Binance capture
    python scripts/bench_book.py --repeat 5 --mbo X.mbo.dbn.zst --binance Y.gz

Each row is the best CPU time (process_time, robust to other jobs on a shared box) of
--repeat runs after one warm-up run (which pays numba's compile or cache load).
"book" = decode + rebuild + emit top-10 snapshots;
"book+features" = that plus load_trades, bars_from_trades(1min) and ofi_features,
i.e. everything `fxray.data build` does with these files except writing.
Messages = DBN records or capture lines in the file. One process, one core.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from fxray.book.reader import bars_from_trades, load_book, load_trades, ofi_features

SHARED = Path(os.environ.get("FXRAY_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MBO = SHARED / "book/databento/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
BINANCE = SHARED / "book/binance_usdm/btcusdt_20240808.gz"


def book_only(path: str) -> int:
    stream = load_book([path])
    for _ in stream:
        pass
    return stream.stats["messages"]


def book_and_features(path: str) -> int:
    stream = load_book([path])
    trades = load_trades(path)
    bars = bars_from_trades(trades, "1min")
    ofi_features(bars.ts, book=stream, trades=trades)
    return stream.stats["messages"]


def best_time(fn, path: str, repeat: int) -> tuple[int, float]:
    n = fn(path)  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.process_time()  # CPU time of this process: robust to a busy shared box
        fn(path)
        times.append(time.process_time() - t0)
    return n, min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbo", default=str(MBO), help="a Databento MBO file (.dbn / .dbn.zst)")
    ap.add_argument("--binance", default=str(BINANCE), help="a Binance depth capture")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per row (best is shown)")
    args = ap.parse_args()
    print(f"{'source':<34} {'stage':<14} {'messages':>10} {'seconds':>9} {'messages/s':>12}")
    for label, path in (("MBO " + Path(args.mbo).name, args.mbo), ("Binance " + Path(args.binance).name, args.binance)):
        for stage, fn in (("book", book_only), ("book+features", book_and_features)):
            n, sec = best_time(fn, path, args.repeat)
            print(f"{label[:34]:<34} {stage:<14} {n:>10,} {sec:>9.4f} {n / sec:>12,.0f}")


if __name__ == "__main__":
    main()
