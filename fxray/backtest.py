"""Run a frozen policy bundle on an fxcache and score it as every fxray number is scored.

    python -m fxray.backtest --policy policy/ --data eurusd_2017q2.fxcache --json bt.json
    python -m fxray.backtest --policy policy/ --data new.fxcache --from 2017-04-03 --to 2017-05-01
    python -m fxray.backtest --policy policy/ --data trained_on.fxcache --window test   # the fold's test window
    python -m fxray.backtest --policy policy/ --data new.fxcache --engine onnxruntime --positions pos.csv

The greedy policy from flat over the window (fxray.eval.backtest), filled as the bundle
says (next open or close), at the bundle's cost (or --cost), with the inputs normalised by
the bundle's train-slice statistics, never by the new data's. Reported: the window's
metrics, the pooled hourly Sharpe with its standard error and PSR, break-even cost, and
buy-and-hold and flat beside it (docs/policy.md). Any market will do whose inputs the policy
can read: its features (built by this fxray) and the order-flow columns the policy reads, by
name (a policy trained on bars alone reads none; the data's others are fed 0, as in training).
Every failure is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from fxray.cli import Parser, atomic_open, check_file_out, iso, run_command
from fxray.data import cache
from fxray.data.arrays import host_arrays
from fxray.policy.bundle import MAX_COST, check_engine, check_features, load, ofi_inputs
from fxray.policy.frozen import ENGINES, as_trained, q_values, score
from fxray.rl.device import DeviceData
from fxray.track.report import bp, fmt, sharpe_line
from fxray.train import resolve_device


def parse_time(text: str, flag: str) -> int:
    try:
        t = np.datetime64(text.rstrip("Z"), "ns")
    except ValueError:
        raise ValueError(f"{flag} {text!r}: not a UTC time; write e.g. 2017-04-03 or 2017-04-03T12:00") from None
    return int(t.astype(np.int64))


def choose_window(args, bundle, market) -> tuple[int, int]:
    """[start, end) bar indices of the data to run on."""
    if args.window in ("val", "test"):
        if market.content_hash != bundle.content_hash:
            raise ValueError(
                f"--window {args.window}: {market.path} is not the data the policy was trained on "
                f"(hash {market.content_hash}, the bundle's {bundle.content_hash}); use --window all or --from/--to"
            )
        start, end = bundle.members[-1].fold[args.window]
    elif args.window == "all":
        start, end = 0, market.n_bars
    else:
        raise ValueError(f"--window {args.window!r}: use all, val or test")
    if args.start:
        start = max(start, int(np.searchsorted(market.ts, parse_time(args.start, "--from"), "left")))
    if args.end:
        end = min(end, int(np.searchsorted(market.ts, parse_time(args.end, "--to"), "left")))
    if end - start < 2:
        raise ValueError(f"{market.path}: the window holds {max(end - start, 0)} bars; a backtest needs at least 2")
    return start, end


@torch.no_grad()
def run(args) -> dict:
    check_file_out(args.json, "--json")  # before the work, not after it
    check_file_out(args.positions, "--positions")
    bundle = load(args.policy)
    market = cache.open(args.data)
    check_features(bundle, market.feature_names, str(args.data))
    ofi, unread = ofi_inputs(bundle, market.ofi_names, market.ofi, str(args.data))  # BundleError: what it lacks
    check_engine(args.engine, ENGINES, "--engine")
    if args.cost is not None and not 0 <= args.cost < MAX_COST:
        raise ValueError(f"--cost {args.cost}: must be in [0, {MAX_COST}) (return units per unit of position change)")
    device = resolve_device(args.device)
    window = choose_window(args, bundle, market)
    data = DeviceData({**host_arrays(market), "ofi": ofi}, device, dtype=bundle.input_dtype)
    q = q_values(bundle, data, window, args.engine)
    report, result = score(bundle, data, window, q, args.cost)
    start, end = window
    out = {
        "policy": str(args.policy),
        "model": bundle.manifest["model"]["choice"],
        "members": [m.name for m in bundle.members],
        "trained_on": bundle.content_hash,
        "data": {
            "path": str(args.data),
            "content_hash": market.content_hash,
            **{k: market.meta.get(k) for k in ("instrument", "bar")},
            "n_bars": market.n_bars,
            "same_as_training": market.content_hash == bundle.content_hash,
        },
        "ofi_read": bundle.ofi_read,  # the order flow the policy reads; the data's other columns it is fed as 0
        "window": {"start": start, "end": end, "first": iso(market.ts[start]), "last": iso(market.ts[end - 1])},
        "engine": args.engine,
        "device": device,
        **report,
    }
    if args.window in ("val", "test"):  # the fold's own window: beside the number training logged for it
        out["as_trained"] = as_trained(bundle, args.window, out["policy"]["metrics"], changes(args, bundle, device))
    print_report(out, bundle)
    if unread:
        print(f"  note: this policy does not read the data's order flow {', '.join(unread)}")
    if args.positions:  # ts (ns, bar close), position: the decision at each bar's close
        with atomic_open(args.positions) as f:
            f.write("ts,position\n")
            f.writelines(f"{t},{p}\n" for t, p in zip(market.ts[start : end - 1].tolist(), result.position.tolist()))
    return out


def changes(args, bundle, device: str) -> list[str]:
    """What this run does otherwise than training scored its fold (fxray.policy.frozen.as_trained)."""
    differs = {
        f"--cost {args.cost}": args.cost is not None and args.cost != bundle.cost,
        "--from/--to cut the window": bool(args.start or args.end),
        f"--engine {args.engine}": args.engine != "torch",
        f"--device {device}": device != "cpu",
    }
    return [text for text, differ in differs.items() if differ]


def print_report(out: dict, bundle) -> None:
    d, w = out["data"], out["window"]
    print(
        f"fxray.backtest: {out['model']} policy ({', '.join(out['members'])}) on {d['path']} ({d['instrument']}, "
        f"{d['bar']}), {w['first']} .. {w['last']} ({w['end'] - w['start']:,} bars), cost {bp(out['cost'])}, "
        f"fill {out['fill']}, {out['engine']} on {out['device']}"
    )
    if d["instrument"] != bundle.manifest["data"]["instrument"]:
        print(f"  note: instrument {d['instrument']!r}, the policy's {bundle.manifest['data']['instrument']!r}")
    for name, r in [("policy", out["policy"]), *out["baselines"].items()]:
        s, m = r["pooled"], r["metrics"]
        extra = f"PSR {fmt(s['psr'], '.3f')}, break-even cost {bp(s['break_even_cost'])}, " if name == "policy" else ""
        print(
            f"  {name:<13} pooled Sharpe {sharpe_line(s)} over {s['n_periods']} hours; {extra}"
            f"total {m['total_return']:+.4f} log, max DD {m['max_drawdown']:.4f} log, {m['n_trades']} trades"
        )
    if "as_trained" in out:  # the per-fold number of the sweep's tables and MLflow: another Sharpe than the pooled
        a, got = out["as_trained"], out["policy"]["metrics"]["sharpe"]
        trained = fmt((a["trained"] or {}).get("sharpe"))
        print(
            f"  fold {a['fold']} {a['window']} window Sharpe {got:+.2f} (daily: the sweep's per-fold number, MLflow's "
            f"{a['window']}_sharpe at step {a['fold']}); training's {trained}: {a['why']}"
        )


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="fxray backtest", description=__doc__.splitlines()[0])
    p.add_argument(
        "--policy", metavar="DIR", required=True, type=Path, help="a bundle directory (python -m fxray.export)"
    )
    p.add_argument("--data", metavar="FXCACHE", required=True, type=Path, help="an fxcache (fxray data build)")
    p.add_argument(
        "--window",
        metavar="all|val|test",
        default="all",
        help="all (default), or val / test: the bundle's last fold's window",
    )
    p.add_argument(
        "--from", metavar="TIME", dest="start", help="first bar close time to include (UTC, e.g. 2017-04-03)"
    )
    p.add_argument("--to", metavar="TIME", dest="end", help="bars closing before this time (UTC)")
    p.add_argument(
        "--cost", metavar="COST", type=float, help="cost per unit of position change (default: the bundle's)"
    )
    p.add_argument(
        "--engine", metavar="torch|onnxruntime", default="torch", help="torch (CPU or GPU) or onnxruntime (CPU)"
    )
    p.add_argument("--device", metavar="DEVICE", default="auto", help="cpu, cuda, cuda:N or auto (engine torch)")
    p.add_argument("--json", metavar="PATH", type=Path, help="write the report as JSON here")
    p.add_argument("--positions", metavar="CSV", type=Path, help="write ts,position per bar as CSV here")
    return p


def main(argv=None) -> int:
    return run_command(run, build_parser().parse_args(argv), announce=True)


if __name__ == "__main__":
    sys.exit(main())
