"""Feed bars to a policy bundle one at a time and write its positions: the live loop, end to end.

    python -m fxray.live --policy policy/ --bars bars.csv --out positions.csv
    tail -f feed.csv | python -m fxray.live --policy policy/ --bars -       # one line out per bar in
    python -m fxray.live --policy policy/ --bars DAT_ASCII_EURUSD_M1_201703.csv --format histdata

In a program: `from fxray.live import Policy, WARMING_UP` (fxray.policy.live; docs/policy.md
has an adapter for an event-driven engine's bar callback).

--format csv (the default, for files and stdin): a header line, then one bar per line:
ts (or timestamp / timestamp_utc / time / datetime: the bar CLOSE time, as int ns since
epoch or ISO 8601; naive times are UTC unless --tz), open, high, low, close, optionally
volume, and the order-flow columns the policy reads, by name (none for a policy trained on
bars alone: an OHLCV file will do; other columns are not read). Read strictly: a bar out of
time order or with a NaN / non-positive price is an error, not skipped. Other formats
(histdata, lean, parquet; no order flow) are read and cleaned by fxray.data.bars.load_bars first.
Output: `ts,position` per bar, position -1 / 0 / 1, or `warmup` for the first
MAX_LOOKBACK bars. Errors: one line on stderr naming the line, exit 2; --out is
written atomically (nothing on error).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from fxray.cli import Parser, atomic_open, check_file_out, run_command
from fxray.data.stream import StreamError
from fxray.policy.bundle import missing_ofi
from fxray.policy.live import ENGINES, WARMING_UP, Policy, to_ns

__all__ = ["Policy", "WARMING_UP", "main"]

TS_COLUMNS = ("ts", "timestamp", "timestamp_utc", "time", "datetime")


def time_zone(name: str | None):
    """The ZoneInfo of --tz (None without it); ValueError unless this machine knows it."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if name is None:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"--tz {name!r}: not a time zone (an IANA name, e.g. UTC, Europe/London, Etc/GMT+5)") from None


def parse_ts(text: str, tz) -> int:
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    t = dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=tz or dt.UTC)
    return to_ns(t)


def csv_bars(lines, where: str, bundle, tz):
    """The header read and checked now (before any output: a header that lacks the order flow
    the policy reads fails at once), then per data line as it comes: (line number, ts text,
    ts ns, open, high, low, close, volume, ofi or None); ofi: {name: value} of the columns
    `bundle` reads (its other ofi columns are not read)."""
    header = next(lines, None)
    if header is None:
        raise ValueError(f"{where}: empty; the first line must be a header (ts,open,high,low,close[,volume])")
    cols = [c.strip().lower() for c in header.strip().split(",")]
    ts_col = next((c for c in TS_COLUMNS if c in cols), None)
    missing = [c for c in ("open", "high", "low", "close") if c not in cols] + ([] if ts_col else ["ts"])
    if missing:
        raise ValueError(f"{where}: header {header.strip()!r} lacks {', '.join(missing)}")
    at = {c: cols.index(c) for c in cols}
    ofi_at = {n: at[n.lower()] for n in bundle.ofi_read if n.lower() in at}  # the header read lower-cased
    missing_ofi(bundle, ofi_at, where, f"its header: {header.strip()}", feed=True)

    def rows():
        for number, line in enumerate(lines, start=2):
            if not line.strip():
                continue
            cells = line.strip().split(",")
            try:
                if len(cells) != len(cols):
                    raise ValueError(f"{len(cells)} fields, the header has {len(cols)}")
                ts_text = cells[at[ts_col]].strip()
                values = [float(cells[at[c]]) for c in ("open", "high", "low", "close")]
                volume = float(cells[at["volume"]]) if "volume" in at else None
                ofi = {n: float(cells[j]) for n, j in ofi_at.items()} or None
                ts = parse_ts(ts_text, tz)
            except ValueError as e:
                raise ValueError(f"{where} line {number}: {e}") from None
            yield number, ts_text, ts, *values, volume, ofi

    return rows()


def loaded_bars(path: Path, fmt: str, tz: str | None):
    """The same tuples from a file fxray.data.bars reads (cleaned: sorted, bad rows dropped). The
    file is read now (its errors before any output), the tuples made as they are taken."""
    from fxray.data.bars import load_bars

    bars = load_bars(path, fmt=fmt, tz=tz)
    volume = bars.volume if bars.volume is not None else np.zeros(len(bars))
    return (
        (i + 1, str(ts), ts, bars.open[i], bars.high[i], bars.low[i], bars.close[i], volume[i], None)
        for i, ts in enumerate(bars.ts.tolist())
    )


def stream(args, policy: Policy, out, tz) -> dict:
    """Feed every bar to the policy, write `ts,position` lines to `out`; the loop's summary.
    `tz`: the ZoneInfo of naive csv times (None: UTC)."""
    live = str(args.bars) == "-"
    where = "stdin" if live else str(args.bars)
    if args.format == "csv":
        source = sys.stdin if live else (gzip.open if where.endswith(".gz") else open)(args.bars, "rt")
        bars = csv_bars(iter(source), where, policy.bundle, tz)
    else:
        bars = loaded_bars(args.bars, args.format, args.tz)  # the file read and cleaned (its errors first)
        missing_ofi(policy.bundle, (), where, f"--format {args.format} bars carry no order flow", feed=True)
    latency, positions, changes, last = [], 0, 0, 0
    out.write("ts,position\n")
    for number, ts_text, ts, o, h, l, c, v, ofi in bars:
        t0 = time.perf_counter_ns()
        try:
            pos = policy.on_bar(ts, o, h, l, c, v, ofi)
        except StreamError as e:
            raise ValueError(f"{where} line {number}: {e}") from None
        latency.append(time.perf_counter_ns() - t0)
        out.write(f"{ts_text},{'warmup' if pos is WARMING_UP else pos}\n")
        if pos is not WARMING_UP:
            positions += 1
            changes += pos != last
            last = pos
        if live:
            out.flush()  # a live feed: each position as soon as its bar is in
    warm = np.asarray(latency[policy.bundle.warmup_bars :], dtype=np.float64) / 1e3
    return {
        "bars": len(latency),
        "warmup_bars": min(len(latency), policy.bundle.warmup_bars),
        "positions": positions,
        "position_changes": changes,
        "final_position": last if positions else None,
        "on_bar_us": {
            "median": float(np.median(warm)) if warm.size else None,
            "p99": float(np.percentile(warm, 99)) if warm.size else None,
            "n": int(warm.size),
        },
    }


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="fxray live", description=__doc__.splitlines()[0])
    p.add_argument(
        "--policy", metavar="DIR", required=True, type=Path, help="a bundle directory (python -m fxray.export)"
    )
    p.add_argument("--bars", metavar="PATH|-", required=True, type=Path, help="a bar file, or - for stdin (csv)")
    p.add_argument(
        "--format", metavar="FORMAT", default="csv", help="csv (strict, default), histdata, lean, parquet, auto"
    )
    p.add_argument("--tz", metavar="ZONE", help="time zone of naive times (default UTC; histdata: its own Etc/GMT+5)")
    p.add_argument("--engine", metavar="ENGINE", default="numpy", help=f"the Q-network's engine: {', '.join(ENGINES)}")
    p.add_argument("--out", metavar="PATH", type=Path, help="write the positions here (default stdout)")
    p.add_argument("--json", metavar="PATH", type=Path, help="write the loop's summary (bars, positions, latency) here")
    return p


def live(args) -> dict:
    """Bars in, positions out (--out, or stdout), the loop's summary on stderr; the summary."""
    check_file_out(args.out, "--out")  # before the feed, not after it
    check_file_out(args.json, "--json")
    tz = time_zone(args.tz)
    policy = Policy(args.policy, engine=args.engine)
    with atomic_open(args.out) if args.out else nullcontext(sys.stdout) as out:
        summary = stream(args, policy, out, tz)
    lat = summary["on_bar_us"]
    print(
        f"fxray.live: {summary['bars']} bars ({summary['warmup_bars']} warm-up), {summary['positions']} positions, "
        f"{summary['position_changes']} changes; on_bar median {lat['median'] or 0:.1f} us, "
        f"p99 {lat['p99'] or 0:.1f} us",
        file=sys.stderr,
    )
    return summary


def main(argv=None) -> int:
    return run_command(live, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
