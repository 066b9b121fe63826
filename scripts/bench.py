"""fxray benchmarks: data path and the fold trainer, printed as one table.

    python scripts/bench.py                          # everything, sized to the device (see below)
    python scripts/bench.py --sections trainer --device cuda --json bench.json
    python scripts/bench.py --device cpu --size tiny                 # every section in seconds (CI runs it)
    python scripts/bench.py --sweep runs/default                     # where a sweep's wall time went

Sizes (--size): gpu, the goals' sizes (4M bars, batch 8192, 4096 envs, ...); cpu, ~a minute on 2
cores; tiny, seconds. Default: gpu on a GPU, else cpu. A size given as a flag wins. Each result
is printed as it is measured (stderr), the table at the end (stdout).

Rows (goals from the issues, for one H200):
  data    open+validate of an N-bar fxcache (<= 50 ms), feature build (>= 1M bars/s, one core),
          synth generation of 1M bars
  trainer one-time upload (<= 100 ms), fold switch (<= 10 ms), one epoch = `steps` learner steps at
          `batch` + one env step of `envs` agents per learner step + greedy backtest over `val-bars`
          (<= 0.3 s), env steps/s, gradient samples/s, host syncs inside an epoch (0);
          with CUDA graphs and without (a solo trial: fxray.rl.trainer.Trainer of one member).
  sweep   (--sweep RUN_DIR or its results.json) the time_breakdown of a sweep that ran: start-up,
          fold setup, learner steps, backtests, overhead and idle, each part's named parts below it
          (docs/tune.md, "Where the time goes"); a results.json from before the breakdown gets it
          computed from its phases and workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fxray.data import cache  # noqa: E402
from fxray.data.folds import Fold  # noqa: E402
from fxray.rl.config import DQNConfig  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.trainer import Trainer  # noqa: E402

SIZES = {
    "gpu": dict(bars=4_000_000, val_bars=500_000, steps=488, batch=8192, envs=4096, epochs=3, synth_bars=1_000_000),
    "cpu": dict(bars=100_000, val_bars=20_000, steps=20, batch=1024, envs=256, epochs=2, synth_bars=1_000_000),
    "tiny": dict(bars=20_000, val_bars=2_000, steps=5, batch=64, envs=16, epochs=1, synth_bars=20_000),
}
T0 = time.perf_counter()


def say(text: str) -> None:
    """Progress on stderr: the table is for stdout."""
    print(f"[bench {time.perf_counter() - T0:6.1f}s] {text}", file=sys.stderr, flush=True)


class ProgressRows(list):
    """The result rows; each one is also said as it is measured."""

    def append(self, row) -> None:
        section, what, value, unit, _ = row
        say(
            f"{section}: {what}: {value:.4g} {unit}"
            if isinstance(value, (int, float))
            else f"{section}: {what}: {value}"
        )
        super().append(row)


SB3_ENV_STEPS_S = 9.1e3  # Stable-Baselines3 DQN, same problem, same H200 (issue 3)
SB3_GRAD_SAMPLES_S = 1.13e6


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_data(args, rows, tmp: Path) -> Path:
    from fxray.data.features import compute_features
    from fxray.data.synth import SynthSpec, simulate, to_cache

    n = args.synth_bars
    t0 = time.perf_counter()
    m = simulate(SynthSpec(n_bars=n, seed=0))
    rows.append(("data", f"synth simulate {n:,} bars", time.perf_counter() - t0, "s", ""))
    torch.set_num_threads(1)
    sec = best_of(lambda: compute_features(m.ts, m.open, m.high, m.low, m.close, m.volume), 3)
    rows.append(("data", f"feature build {n:,} bars (one core)", n / sec, "bars/s", ">= 1M bars/s"))
    path = tmp / f"bench-{args.bars}.fxcache"
    t0 = time.perf_counter()
    to_cache(SynthSpec(n_bars=args.bars, seed=0), path)
    rows.append(("data", f"synth -> fxcache, {args.bars:,} bars", time.perf_counter() - t0, "s", ""))
    cache.open(path)  # page cache warm, as on a second run
    rows.append(
        (
            "data",
            f"open (structure + metadata) {args.bars:,} bars",
            best_of(lambda: cache.open(path, verify=False)) * 1e3,
            "ms",
            "<= 50 ms",
        )
    )
    rows.append(
        ("data", f"open + verify (values, content hash) {args.bars:,} bars", best_of(lambda: cache.open(path)), "s", "")
    )
    torch.set_num_threads(os.cpu_count() or 1)
    return path


def bench_upload(args, rows, path: Path) -> None:
    """Best of 5 uploads of the whole cache (after one warm-up upload)."""
    dev = torch.device(args.device)
    market = cache.open(path)
    DeviceData(market, dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    def upload():
        DeviceData(market, dev)
        sync()

    rows.append(("upload", f"upload {market.n_bars:,} bars, best of 5", best_of(upload) * 1e3, "ms", "<= 100 ms"))


def count_syncs_in_epoch(trainer: Trainer, steps: int) -> int | str:
    """0 if `steps` hot steps run under sync_debug_mode='error' (any sync raises), else 'n/a'."""
    if trainer.data.device.type != "cuda":
        return "n/a (cpu)"
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            trainer.graph.replay() if trainer.graph is not None else trainer.dqn.step()
        return 0
    except RuntimeError as e:
        return f"sync: {str(e).splitlines()[0][:60]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def bench_trainer(args, rows, path: Path) -> None:
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    market = cache.open(path)
    # a first CUDA context + allocator warm-up is not the upload (on the CPU: harmless, and run)
    head = {"ts": market.ts, "features": market.features, "ofi": market.ofi, "close": market.close}
    DeviceData({**{k: v[:1000] for k, v in head.items()}, "open": market.targets[:1000, 0]}, dev)
    sync()
    t0 = time.perf_counter()
    data = DeviceData(market, dev)
    sync()
    rows.append(("trainer", f"upload {market.n_bars:,} bars", (time.perf_counter() - t0) * 1e3, "ms", "<= 100 ms"))
    n = market.n_bars
    val = min(args.val_bars, n // 4)
    folds = [
        Fold(0, (0, n // 2), (n // 2 + 100, n // 2 + 100 + val), (n - val, n)),
        Fold(1, (n // 4, 3 * n // 4), (3 * n // 4 + 100, 3 * n // 4 + 100 + val), (n - val, n)),
    ]
    variants = [("graphs", True), ("eager", False)]
    for tag, graphs in variants if dev.type == "cuda" else variants[1:]:
        cfg = DQNConfig(
            num_envs=args.envs,
            batch_size=args.batch,
            steps_per_epoch=args.steps,
            buffer_steps=max(64, 2 * args.n_step + 2),
            hidden=256,
            depth=2,
            n_step=args.n_step,
            epochs=args.epochs,
            patience=args.epochs,
            graphs=graphs,
        )
        try:
            bench_variant(args, rows, data, folds, cfg, tag, sync)
        except Exception as e:  # a variant that fails is a row, not the end of the table
            rows.append(
                ("trainer", f"[{tag}] FAILED", str(e).splitlines()[0][:60] if str(e) else type(e).__name__, "", "")
            )


def bench_variant(args, rows, data, folds, cfg, tag, sync) -> None:
    val = folds[0].val[1] - folds[0].val[0]
    trainer = Trainer(data, [cfg])
    t0 = time.perf_counter()
    (result,) = trainer.run_fold(folds[0], [0])  # includes the one-time graph capture
    first = time.perf_counter() - t0
    switch = []
    for f in (folds[1], folds[0], folds[1]):
        t0 = time.perf_counter()
        data.set_fold(f)
        trainer.dqn.begin([1])
        sync()
        switch.append(time.perf_counter() - t0)
    (result,) = trainer.run_fold(folds[1], [1])
    epoch = float(np.median([c["epoch_s"] for c in result.curve]))
    train_only = float(np.median([c["train_s"] for c in result.curve]))
    val_s = float(np.median([c["val_s"] for c in result.curve]))
    rows.append(("trainer", f"[{tag}] first fold incl. setup/capture ({result.epochs_run} ep)", first, "s", ""))
    rows.append(("trainer", f"[{tag}] fold switch", min(switch) * 1e3, "ms", "<= 10 ms"))
    rows.append(
        (
            "trainer",
            f"[{tag}] epoch: {args.steps} x batch {args.batch} + {args.envs} envs + val {val:,}",
            epoch,
            "s",
            "<= 0.3 s",
        )
    )
    rows.append(("trainer", f"[{tag}]   of which val backtest", val_s, "s", ""))
    rows.append(
        (
            "trainer",
            f"[{tag}] env steps/s",
            args.steps * args.envs / train_only,
            "steps/s",
            f">= {1000 * SB3_ENV_STEPS_S:.3g} (1000x SB3)",
        )
    )
    rows.append(
        (
            "trainer",
            f"[{tag}] gradient samples/s",
            args.steps * args.batch / train_only,
            "samples/s",
            f">= {10 * SB3_GRAD_SAMPLES_S:.3g} (10x SB3)",
        )
    )
    rows.append(("trainer", f"[{tag}] host syncs inside an epoch", count_syncs_in_epoch(trainer, args.steps), "", "0"))
    if args.profile and not cfg.graphs:
        profile_step(trainer, args.profile)


def profile_step(trainer: Trainer, out: Path) -> None:
    """Kernel table of 20 eager hot steps (where the time of a step goes), written to `out`."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(20):
            trainer.dqn.step()
        trainer.data.synchronize()
    key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    out.write_text(prof.key_averages().table(sort_by=key, row_limit=40))


SWEEP_PARTS = (  # time_breakdown's parts as the table names them, and each one's named parts
    ("startup", "start-up: Ray, workers, data, Tune's first trials", "startup_parts"),
    ("fold_setup", "fold setup", "fold_setup_parts"),
    ("learner", "learner steps", None),
    ("backtest", "val/test backtests and references", None),
    ("overhead", "overhead: Tune, Optuna, MLflow, the driver", "overhead_parts"),
    ("idle", "idle: no fold for a worker", None),
)


def sweep_results(path: Path) -> Path:
    return path / "results.json" if path.is_dir() else path


def bench_sweep(rows, path: Path) -> None:
    """The time_breakdown of the sweep at `path` (a run directory or its results.json) as rows."""
    from fxray.track.timing import time_breakdown

    r = json.loads(sweep_results(path).read_text())
    tb = r.get("time_breakdown") or time_breakdown(r["started"], r["wall_s"], r["phases"], r["workers"], r["trials"])
    wall = r["wall_s"]
    folds = sum(len(t["folds"]) for t in r["trials"])
    rows.append(
        ("sweep", f"wall: {r['n_trials']} trials, {folds} trial-folds, {tb['workers']} worker(s)", wall, "s", "")
    )
    for key, label, named in SWEEP_PARTS:
        rows.append(("sweep", f"{label} ({tb[key + '_s'] / wall:.0%})", tb[key + "_s"], "s", ""))
        for name, seconds in (tb.get(named) or {}).items():
            rows.append(("sweep", f"  {name}", seconds, "s", ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sections",
        metavar="LIST",
        help="data, upload, trainer (comma-separated; default data,trainer without --sweep)",
    )
    p.add_argument("--sweep", type=Path, metavar="RUN_DIR", help="print where this sweep's wall time went")
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", metavar="DEVICE", help="cpu or cuda"
    )
    p.add_argument("--size", choices=sorted(SIZES), help="gpu, cpu or tiny (default: gpu on a GPU, else cpu)")
    p.add_argument("--bars", type=int, metavar="N", help="bars of the benchmark market (default: by size)")
    p.add_argument("--synth-bars", type=int, metavar="N", help="bars of the data section's market (default: by size)")
    p.add_argument("--val-bars", type=int, metavar="N", help="bars of the val backtest (default: by device)")
    p.add_argument("--steps", type=int, metavar="N", help="learner steps per epoch (default: by device)")
    p.add_argument("--batch", type=int, metavar="N", help="learner batch (default: by device)")
    p.add_argument("--envs", type=int, metavar="N", help="agents stepped per learner step (default: by device)")
    p.add_argument("--n-step", type=int, default=3, metavar="N", help="n-step return (default 3)")
    p.add_argument("--epochs", type=int, metavar="N", help="epochs per fold (default: by device)")
    p.add_argument("--cache", type=Path, metavar="FXCACHE", help="reuse this fxcache instead of generating one")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON here")
    p.add_argument("--profile", type=Path, metavar="PATH", help="write a kernel table of 20 eager steps here")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "bench: error: --device cuda: no CUDA device here; drop --device (CPU sizes) or run on a GPU",
            file=sys.stderr,
        )
        return 2
    if args.sweep and not sweep_results(args.sweep).is_file():
        print(
            f"bench: error: --sweep {args.sweep}: no results.json there; give a sweep's run directory", file=sys.stderr
        )
        return 2
    size = args.size or ("gpu" if args.device.startswith("cuda") else "cpu")
    for k, v in SIZES[size].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    say(f"device {args.device}: {size} sizes " + ", ".join(f"{k}={getattr(args, k):,}" for k in SIZES[size]))
    sections = set((args.sections or ("" if args.sweep else "data,trainer")).split(","))
    rows: list[tuple] = ProgressRows()
    if args.sweep:
        bench_sweep(rows, args.sweep)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.cache
        if "data" in sections:
            say("data: synth 1M bars, features, fxcache write and open")
            path = bench_data(args, rows, Path(tmp))
        if path is None and sections & {"upload", "trainer"}:
            from fxray.data.synth import SynthSpec, to_cache

            path = Path(tmp) / "bench.fxcache"
            to_cache(SynthSpec(n_bars=args.bars, seed=0), path)
        if "upload" in sections:
            bench_upload(args, rows, path)
        if "trainer" in sections:
            say(f"trainer: {args.epochs} epochs x {args.steps} steps per variant, two folds each")
            bench_trainer(args, rows, path)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(
        f"fxray bench  {time.strftime('%Y-%m-%d')}  torch {torch.__version__}  device {args.device} "
        f"({gpu})  cpu {platform.processor() or platform.machine()} x{os.cpu_count()}"
    )
    print(f"{'section':<8} {'what':<62} {'value':>12} {'unit':<10} goal")
    for section, what, value, unit, goal in rows:
        v = f"{value:>12.4g}" if isinstance(value, (int, float)) else f"{str(value):>12}"
        print(f"{section:<8} {what:<62} {v} {unit:<10} {goal}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "gpu": gpu,
                    "torch": torch.__version__,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "rows": [dict(zip(("section", "what", "value", "unit", "goal"), r)) for r in rows],
                },
                indent=1,
                default=str,
            )
        )
    return 1 if any("FAILED" in what for _, what, *_ in rows) else 0  # a broken variant fails the run


if __name__ == "__main__":
    sys.exit(main())
