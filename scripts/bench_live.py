"""Per-bar latency of fxray.live.Policy.on_bar on real bars: median and tail, per engine.

    python scripts/bench_live.py                         # builds a default-size policy on EURUSD Jan 2017
    python scripts/bench_live.py --policy policy/ --bars ../shared/data/bars/eurusd_m1_2017q1 --json bench.json

Without --policy: an fxcache of the shared EURUSD January bars, one short training of the
default QNetwork (256 x 2, dueling; a few steps: the latency does not depend on what it
learned), its checkpoint exported as a bundle, all in a temp directory. Then every bar of
--bars (default: the shared EURUSD Q1 HistData files, ~93k bars) goes through on_bar, timed
with perf_counter_ns around each call; the first MAX_LOOKBACK (warm-up) calls are left out.
Also timed alone: FeatureStream.update (the features) on the same bars. One process, one
thread for numpy's BLAS and onnxruntime (a bar is one row).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy / torch load their thread pools
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "bars" / "eurusd_m1_2017q1"


def make_policy(workdir: Path) -> Path:
    """A bundle of a default-size QNetwork trained for a few steps on EURUSD January 2017."""
    import torch

    from fxray.data import cache
    from fxray.data.bars import build_cache, load_bars
    from fxray.data.folds import FoldSpec, make_folds
    from fxray.policy.export import choose, export_bundle, load_candidate
    from fxray.rl.config import DQNConfig
    from fxray.rl.device import DeviceData
    from fxray.rl.trainer import Trainer

    torch.manual_seed(0)
    bars = load_bars(SHARED / "DAT_ASCII_EURUSD_M1_201701.csv", fmt="histdata")
    path = workdir / "eurusd_jan.fxcache"
    build_cache(bars, path, instrument="EURUSD", source=str(bars.source))
    market = cache.open(path)
    fold = make_folds(market.ts, FoldSpec(train="4d", val="2d", test="2d", max_folds=1))[0]
    cfg = DQNConfig(epochs=1, steps_per_epoch=5, num_envs=32, batch_size=128, buffer_steps=64, episode_len=64)
    trainer = Trainer(DeviceData(market, "cpu"), [cfg])
    trainer.run_fold(fold, [0], checkpoint_dirs=[workdir / "ckpt"])
    out = workdir / "policy"
    members = choose([load_candidate(workdir / "ckpt" / "fold0.safetensors")], "last")
    export_bundle(members, market, out, model="last", source={"kind": "bench"})
    return out


def percentiles(ns: list[int]) -> dict:
    us = np.asarray(ns, dtype=np.float64) / 1e3
    return {
        "median_us": float(np.median(us)),
        "p99_us": float(np.percentile(us, 99)),
        "p999_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
        "mean_us": float(us.mean()),
        "n": int(us.size),
    }


def bench(policy_dir: Path, bars, engine: str) -> dict:
    from fxray.data.features import MAX_LOOKBACK
    from fxray.data.stream import FeatureStream
    from fxray.live import Policy

    rows = list(zip(bars.ts.tolist(), bars.open.tolist(), bars.high.tolist(), bars.low.tolist(), bars.close.tolist()))
    clock = time.perf_counter_ns
    policy = Policy(policy_dir, engine=engine)
    timings = []
    for ts, o, h, l, c in rows:
        t0 = clock()
        policy.on_bar(ts, o, h, l, c)
        timings.append(clock() - t0)
    stream = FeatureStream()
    features = []
    for ts, o, h, l, c in rows:
        t0 = clock()
        stream.update(ts, o, h, l, c)
        features.append(clock() - t0)
    return {"on_bar": percentiles(timings[MAX_LOOKBACK:]), "features_only": percentiles(features[MAX_LOOKBACK:])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", type=Path, help="a bundle (default: build a default-size one, see above)")
    p.add_argument("--bars", type=Path, default=SHARED, help="bars to stream (default: the shared EURUSD Q1)")
    p.add_argument("--format", default="auto", help="fxray.data.bars format of --bars (auto, histdata, csv, ...)")
    p.add_argument("--engines", default="numpy,onnxruntime", help="comma-separated: numpy, onnxruntime")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    from fxray.data.bars import load_bars

    bars = load_bars(args.bars, fmt=args.format)
    with tempfile.TemporaryDirectory() as d:
        policy_dir = args.policy or make_policy(Path(d))
        from fxray.policy.bundle import load

        manifest = load(policy_dir).manifest
        net = manifest["network"]
        out = {
            "onnx_max_abs_diff_vs_torch": manifest["onnx"]["max_abs_diff_vs_torch"],
            "bars": len(bars),
            "source": str(args.bars),
            "network": f"{net['hidden']}x{net['depth']} dueling",
            "cpu": os.cpu_count(),
            "engines": {e: bench(policy_dir, bars, e) for e in args.engines.split(",")},
        }
    print(f"on_bar over {out['bars']:,} bars of {args.bars.name} ({out['network']} QNetwork), after the warm-up:")
    for engine, r in out["engines"].items():
        for part, s in r.items():
            print(
                f"  {engine:<12} {part:<14} median {s['median_us']:6.1f} us  p99 {s['p99_us']:6.1f} us  "
                f"p99.9 {s['p999_us']:6.1f} us  max {s['max_us']:8.1f} us  (n {s['n']:,})"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
