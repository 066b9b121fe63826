"""Population throughput: K members in one collect+learn step, for K = 1, 2, 4, ... (issue 19).

    python scripts/bench_population.py --quick                    # one H200: < ~60 s incl. captures
    python scripts/bench_population.py --max-k 64 --json pop.json # the table of docs/benchmarks.md
    python scripts/bench_population.py --quick --device cpu       # CPU smoke, tiny sizes: seconds

For each size (per-member batch x agents) and each K, a Population of K members (different lr,
gamma and seed each, as a sweep's configs would be) is built on one resident market, its step
captured in a CUDA graph (on CUDA), and `--steps` steps timed after a warm-up. Printed per row:
the step time, gradient samples/s (K x batch per step), env steps/s (K x agents), the speed-up
of samples/s over K = 1, the batched val backtest of all K members, and GPU memory:
torch.cuda.max_memory_allocated() over the run of that K, less the resident market, per member.
K = 1 is a solo trial (the same code: fxray.rl.trainer.Trainer).
K doubles until --max-k, or until the next K would not fit (the last peak x 2 > 90 % of the
device), or a CUDA out-of-memory error (a row says so). The market is random (throughput does
not depend on what is learned).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fxray.data.folds import Fold  # noqa: E402
from fxray.rl.config import DQNConfig  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.trainer import Trainer  # noqa: E402

# (bars, val bars, sizes as (batch, agents), steps timed, max K, hidden)
PROFILES = {
    "cuda": dict(bars=4_000_000, val_bars=500_000, sizes=[(8192, 2048), (1024, 256)], steps=100, max_k=64, hidden=256),
    "cuda-quick": dict(bars=1_000_000, val_bars=100_000, sizes=[(8192, 2048)], steps=30, max_k=16, hidden=256),
    "cpu": dict(bars=50_000, val_bars=5_000, sizes=[(256, 64)], steps=10, max_k=8, hidden=64),
    "cpu-quick": dict(bars=20_000, val_bars=2_000, sizes=[(64, 16)], steps=5, max_k=4, hidden=32),
}
T0 = time.perf_counter()
MATMUL = ["tf32"]  # --matmul: what members() gives its configs


def say(text: str) -> None:
    print(f"[bench_population {time.perf_counter() - T0:6.1f}s] {text}", file=sys.stderr, flush=True)


def random_market(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ts = (1_700_000_000 + 60 * np.arange(1, n + 1, dtype=np.int64)) * 10**9
    close = 100 * np.exp(np.cumsum(rng.normal(0, 1e-4, n)))
    return {
        "ts": ts,
        "features": rng.standard_normal((n, 42), dtype=np.float32),
        "ofi": rng.standard_normal((n, 8), dtype=np.float32),
        "open": close * np.exp(rng.normal(0, 1e-5, n)),
        "close": close,
    }


def members(k: int, batch: int, envs: int, hidden: int, steps: int) -> list[DQNConfig]:
    """K configs of one shape that differ as a sweep's would (lr, gamma, n_step)."""
    base = DQNConfig(
        matmul=MATMUL[0],
        num_envs=envs,
        batch_size=batch,
        hidden=hidden,
        buffer_steps=64,
        steps_per_epoch=steps,
        epochs=1,
        n_step=3,
    )
    return [base.replace(lr=5e-4 * (1 + i % 4), gamma=0.95 + 0.01 * (i % 3), n_step=1 + i % 3) for i in range(k)]


def timed_steps(step, steps: int, sync) -> float:
    """Seconds per step, over `steps` steps after 3 of warm-up."""
    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def run(args) -> list[dict]:
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    say(f"market of {args.bars:,} random bars on {dev}")
    data = DeviceData(random_market(args.bars), dev)
    n = args.bars
    fold = Fold(
        0,
        (0, n - 2 * args.val_bars - 200),
        (n - 2 * args.val_bars - 100, n - args.val_bars - 100),
        (n - args.val_bars, n),
    )
    sync()
    resident = torch.cuda.memory_allocated(dev) if cuda else 0
    total = torch.cuda.get_device_properties(dev).total_memory if cuda else 0
    rows = []
    for batch, envs in args.sizes:
        k, base = 1, None
        peak_last = 0
        while k <= args.max_k:
            if cuda and peak_last and resident + 2 * (peak_last - resident) > 0.9 * total:
                rows.append({"kind": "stop", "K": k, "batch": batch, "envs": envs, "note": "next K would not fit"})
                say(f"K={k}: would not fit ({peak_last / 2**30:.1f} GiB at K={k // 2}); stopping")
                break
            try:
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(dev)
                t_build = time.perf_counter()
                pop = Trainer(data, members(k, batch, envs, args.hidden, args.steps))
                pop.dqn.q_network.split_k &= not args.no_split_k
                pop._begin(fold, list(range(k)))
                if pop.use_graph:
                    pop._capture()
                sync()
                setup = time.perf_counter() - t_build
                step = pop.graph.replay if pop.graph is not None else pop.dqn.step
                s = timed_steps(step, args.steps, sync)
                t0 = time.perf_counter()
                pop.evaluate(fold.val, list(range(k)))
                val_s = time.perf_counter() - t0
                peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
            except torch.cuda.OutOfMemoryError:
                rows.append({"kind": "oom", "K": k, "batch": batch, "envs": envs, "note": "CUDA out of memory"})
                say(f"K={k}: CUDA out of memory; stopping")
                break
            except Exception as e:  # a K that fails is a row, not the end of the table
                note = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                rows.append({"kind": "failed", "K": k, "batch": batch, "envs": envs, "note": note})
                say(f"K={k}: {note}; stopping this size")
                break
            r = row("population", k, batch, envs, s, val_s, (peak - resident) / k / 2**20 if cuda else None)
            r["setup_s"] = setup
            base = base or r["samples_s"]
            r["speedup"] = r["samples_s"] / base
            rows.append(r)
            say(
                f"K={k}: {s * 1e3:.2f} ms/step, {r['samples_s']:.3g} samples/s ({r['speedup']:.2f}x K=1), "
                f"setup {setup:.1f}s"
            )
            del pop, step
            peak_last = peak
            k *= 2
    return rows


def row(kind, k, batch, envs, step_s, val_s, mib_per_member) -> dict:
    return {
        "kind": kind,
        "K": k,
        "batch": batch,
        "envs": envs,
        "step_ms": step_s * 1e3,
        "samples_s": k * batch / step_s,
        "env_steps_s": k * envs / step_s,
        "val_backtest_s": val_s,
        "gpu_mib_per_member": mib_per_member,
    }


def table(rows: list[dict]) -> str:
    head = f"{'kind':<11} {'K':>4} {'batch':>6} {'agents':>6} {'ms/step':>9} {'samples/s':>11} {'env steps/s':>12} "
    head += f"{'x K=1':>6} {'val all K s':>11} {'MiB/member':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["kind"] in ("oom", "stop", "failed"):
            lines.append(f"{r['kind']:<11} {r['K']:>4} {r['batch']:>6} {r['envs']:>6}  {r['note']}")
            continue
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        lines.append(
            f"{r['kind']:<11} {r['K']:>4} {r['batch']:>6} {r['envs']:>6} {r['step_ms']:>9.3f} {r['samples_s']:>11.3g} "
            f"{r['env_steps_s']:>12.3g} {fmt(r.get('speedup'), '6.2f'):>6} {fmt(r['val_backtest_s'], '11.3f'):>11} "
            f"{fmt(r['gpu_mib_per_member'], '10.1f'):>10}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_population", description=__doc__.splitlines()[0])
    p.add_argument("--device", metavar="DEV", help="cuda or cpu (default: cuda if present)")
    p.add_argument("--quick", action="store_true", help="small sizes: < ~60 s on one H200, seconds on a CPU")
    p.add_argument("--max-k", type=int, metavar="K", help="largest population (default: by profile)")
    p.add_argument("--bars", type=int, metavar="N", help="bars of the random market (default: by profile)")
    p.add_argument("--val-bars", type=int, metavar="N", help="bars of the val backtest (default: by profile)")
    p.add_argument("--sizes", metavar="BxE,...", help="per-member batch x agents, e.g. 8192x2048,1024x256")
    p.add_argument("--steps", type=int, metavar="N", help="steps timed per K (default: by profile)")
    p.add_argument("--hidden", type=int, metavar="H", help="hidden width (default: by profile)")
    p.add_argument(
        "--matmul",
        choices=("tf32", "fp32"),
        default="tf32",
        help="CUDA matmul precision (dqn.matmul; default tf32, as a sweep trains)",
    )
    p.add_argument(
        "--no-split-k", action="store_true", help="weight gradients by autograd's own bmm backward (before the split)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON here")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    MATMUL[0] = args.matmul
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here; drop --device (CPU sizes) or run on a GPU")
    if args.sizes is not None:
        try:
            args.sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
            assert all(len(s) == 2 and min(s) >= 1 for s in args.sizes)
        except (ValueError, AssertionError):
            parser.error(f"--sizes {args.sizes!r}: expected BATCHxAGENTS[,BATCHxAGENTS...], e.g. 8192x2048,1024x256")
    profile = PROFILES[("cuda" if args.device.startswith("cuda") else "cpu") + ("-quick" if args.quick else "")]
    for key, value in profile.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = run(args)
    print(table(rows))
    if args.json:
        meta = {
            "device": torch.cuda.get_device_name(0)
            if args.device.startswith("cuda")
            else platform.processor() or "cpu",
            "torch": torch.__version__,
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "command": " ".join(sys.argv),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
