"""Make and inspect fxcache files.

    fxray data synth --bars 1_000_000 --seed 0 --out synth.fxcache
    fxray data synth --bars 200_000 --structure interaction --beta 0.04 --out nonlinear.fxcache
    fxray data build --bars ../shared/data/bars/eurusd_m1_2017q1 --format histdata \\
        --tz Etc/GMT+5 --instrument EURUSD --out eurusd.fxcache
    fxray data build --book ESH4.mbo.dbn.zst --trades ESH4.mbo.dbn.zst --bar 1min --out es.fxcache
    fxray data info eurusd.fxcache [--experiment experiments/default.yaml] [--json info.json]

Each also as python -m fxray.data_cmd. --book and --trades need the `book` extra
(pip install 'fxray[book]'). Every failure is one line on stderr naming the file and the fix, exit status 2,
and no output file (writes are atomic).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from fxray.cli import check_file_out, command_parser, iso, run_command, seed
from fxray.data import cache
from fxray.data.folds import FoldSpec, bar_spacing, make_folds
from fxray.data.synth import STRUCTURES, SynthSpec, to_cache

BOOK_EXTRA = ("numba", "databento_dbn", "zstandard")  # what `pip install 'fxray[book]'` brings


def cmd_synth(args) -> dict:
    check_file_out(args.out, "--out")  # before minutes of work
    spec = SynthSpec(n_bars=args.bars, seed=args.seed, structure=args.structure, beta=args.beta)
    t0 = time.perf_counter()
    digest = to_cache(spec, args.out)
    seconds = time.perf_counter() - t0
    print(
        f"wrote {args.out}: {spec.n_bars:,} synthetic 1-min bars, seed {spec.seed}, structure {spec.structure}, "
        f"hash {digest} ({seconds:.1f}s)"
    )
    return {"out": str(args.out), "n_bars": spec.n_bars, "seed": spec.seed, "content_hash": digest, "seconds": seconds}


def cmd_build(args) -> dict:
    from fxray.data import bars as bars_mod

    flow = args.trades or args.book  # MBO / MBP-10 / Binance book files carry the trade tape too
    if args.bars is None and not flow:
        raise ValueError("build: give --bars FILE_OR_DIR, or --trades/--book FILE to build bars from trades")
    check_file_out(args.out, "--out")  # before minutes of work
    t0 = time.perf_counter()
    ofi, covered = None, 0.0
    if flow:  # the order-flow engine is numba-compiled; DBN and .zst input need the other two
        missing = [m for m in BOOK_EXTRA if importlib.util.find_spec(m) is None]  # None: not importable
        if missing:
            raise ValueError(
                f"build {'--book' if args.book else '--trades'}: order flow needs the `book` extra "
                f"({', '.join(missing)} not installed): pip install 'fxray[book]'"
            )
        from fxray.book import reader as book

        trades = book.load_trades(flow)
    if args.bars is not None:
        bars = bars_mod.load_bars(args.bars, fmt=args.format, tz=args.tz)
        source = str(args.bars)
    else:
        bars = book.bars_from_trades(trades, args.bar)
        source = "trades:" + ",".join(map(str, flow))
    if flow:
        ofi, coverage = book.ofi_features(bars.ts, book=book.load_book(args.book) if args.book else None, trades=trades)
        covered = float(np.mean(coverage))
        source += " + book:" + ",".join(map(str, (args.book or []) + (args.trades or [])))
    instrument = args.instrument or Path(str(args.bars or flow[0])).name.split(".")[0]
    # build_cache names the ofi columns with fxray.data.schema.OFI_NAMES (zeros or real alike)
    digest = bars_mod.build_cache(bars, args.out, instrument=instrument, source=source, bar=args.bar, ofi=ofi)
    market = cache.open(args.out)
    seconds = time.perf_counter() - t0
    print(
        f"wrote {args.out}: {market.n_bars:,} bars of {instrument} "
        f"({iso(market.ts[0])} .. {iso(market.ts[-1])}), book coverage {covered:.0%}, "
        f"hash {digest} ({seconds:.1f}s)"
    )
    return {
        "out": str(args.out),
        "n_bars": market.n_bars,
        "instrument": instrument,
        "content_hash": digest,
        "book_coverage": covered,
        "seconds": seconds,
    }


def describe(market: cache.Market, spec: FoldSpec) -> dict:
    """Rows, span, spacing, per-column stats and the folds `spec` makes on this cache."""
    ts = market.ts
    columns = []
    for names, values in ((market.feature_names, market.features), (market.ofi_names, market.ofi)):
        mean, std = values.mean(0, dtype=np.float64), values.std(0, dtype=np.float64)
        columns += [{"name": n, "mean": float(m), "std": float(s)} for n, m, s in zip(names, mean, std)]
    try:
        folds, folds_error = [f.as_dict() for f in make_folds(ts, spec)], None
    except ValueError as e:
        folds, folds_error = [], str(e)
    return {
        "path": market.path,
        "rows": market.n_bars,
        "instrument": market.meta.get("instrument"),
        "bar": market.meta.get("bar"),
        "source": market.meta.get("source"),
        "content_hash": market.content_hash,
        "content_hash_algo": market.meta.get("content_hash_algo", "sha256"),
        "first": iso(ts[0]),
        "last": iso(ts[-1]),
        "span_days": float((ts[-1] - ts[0]) / 86400e9),
        "bar_spacing_s": bar_spacing(ts) / 1e9,
        "gaps_over_1h": int(np.count_nonzero(np.diff(ts) > 3600 * 10**9)),
        "book_coverage": float(np.any(market.ofi != 0, axis=1).mean()),  # rows with order-book data
        "columns": columns,
        "fold_spec": spec.__dict__,
        "folds": folds,
        "folds_error": folds_error,
    }


def cmd_info(args) -> dict:
    market = cache.open(args.path)  # every value checked, the content hash recomputed
    spec = FoldSpec()
    if args.experiment:
        from fxray.rl.experiment import load

        spec = load(args.experiment).folds
    info = describe(market, spec)
    print(f"{info['path']}: {info['rows']:,} rows of {info['instrument']} ({info['bar']}), source {info['source']}")
    print(
        f"  span {info['first']} .. {info['last']} ({info['span_days']:.1f} days), "
        f"bar spacing {info['bar_spacing_s']:.0f}s, {info['gaps_over_1h']} gaps > 1h"
    )
    print(
        f"  verified: ts increasing, no NaN/Inf, prices > 0, content hash {info['content_hash_algo']} "
        f"{info['content_hash']} matches"
    )
    print(f"  book coverage {info['book_coverage']:.0%}")
    print(f"  {'column':<24}{'mean':>12}{'std':>12}")
    for c in info["columns"]:
        print(f"  {c['name']:<24}{c['mean']:>12.4g}{c['std']:>12.4g}")
    if info["folds_error"]:
        print(f"  folds: {info['folds_error']}")
    else:
        print(f"  folds ({spec.train} train / {spec.val} val / {spec.test} test): {len(info['folds'])}")
        for f in info["folds"]:
            rng = " ".join(
                f"{k} {iso(market.ts[f[k][0]])[:16]}..{iso(market.ts[f[k][1] - 1])[:16]}"
                for k in ("train", "val", "test")
            )
            print(f"    fold {f['k']}: {rng}")
    return info


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("data", __doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help="synth, build or info")
    s = sub.add_parser("synth", help="write the synthetic market (planted signal) as an fxcache")
    s.add_argument("--bars", type=int, default=1_000_000, metavar="N", help="bars to write (after warm-up)")
    s.add_argument("--seed", type=seed, default=0, metavar="INT", help="the market's random seed (default 0)")
    s.add_argument("--out", required=True, type=Path, metavar="FXCACHE", help="the file to write")
    s.add_argument(
        "--structure",
        default="flow",
        choices=STRUCTURES,
        help="where the edge lives: flow (default), session, or a nonlinear one (docs/metrics.md)",
    )
    s.add_argument("--beta", type=float, default=SynthSpec.beta, metavar="X", help="the planted edge's strength")
    b = sub.add_parser("build", help="build an fxcache from bar files (and order-book / trade files)")
    b.add_argument("--bars", type=Path, metavar="FILE_OR_DIR", help="a bar file or a directory of them")
    b.add_argument("--format", default="auto", metavar="FORMAT", help="auto (default), csv, histdata, lean, parquet")
    b.add_argument(
        "--tz",
        metavar="ZONE",
        help="time zone of naive timestamps (default: the format's own: UTC; HistData Etc/GMT+5)",
    )
    b.add_argument(
        "--instrument", metavar="NAME", help="instrument name stored in the cache (default: from the file name)"
    )
    b.add_argument(
        "--book",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="order-book files: Databento MBO/MBP-10 DBN, Binance depth (needs the book extra)",
    )
    b.add_argument(
        "--trades", type=Path, nargs="+", metavar="FILE", help="trade files: DBN trades/MBO, Binance (book extra)"
    )
    b.add_argument(
        "--bar",
        default="1min",
        metavar="LENGTH",
        help="bar length label (1min, 10s); with --trades/--book only: the bar to build",
    )
    b.add_argument("--out", required=True, type=Path, metavar="FXCACHE", help="the file to write")
    i = sub.add_parser("info", help="check an fxcache (every value, its content hash) and describe it and its folds")
    i.add_argument("path", type=Path, metavar="FXCACHE", help="the file to describe")
    i.add_argument("--experiment", type=Path, metavar="YAML", help="experiment YAML whose folds to show")
    for sp in (s, b, i):
        sp.add_argument("--json", type=Path, metavar="PATH", help="also write the result as JSON here")
    return p


def run(args) -> dict:
    check_file_out(args.json, "--json")  # before minutes of work
    return {"synth": cmd_synth, "build": cmd_build, "info": cmd_info}[args.cmd](args)


def main(argv=None) -> int:
    return run_command(run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
