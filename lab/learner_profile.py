"""Where a learner step's GPU time goes (issue 50): kernels by device time, graph vs eager.

    python lab/learner_profile.py --device cuda --ks 3,24          # one GPU: ~1-2 min
    python lab/learner_profile.py --device cpu --quick             # the script itself, seconds

For each population size K (members of the default GPU profile's shape: batch 8192, 2048
agents, hidden 256, inputs ridge, demo 1), on a random market: ms per step replayed as a
CUDA graph at dqn.matmul tf32 and fp32, ms per step eager (tf32), and a torch.profiler
table of the eager step's kernels by device time, with the sum of kernel time per step (if the
graph's step is near that sum, the GPU is kernel-bound; if well above it, launch gaps).
A probe: its numbers go to the note, not to a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("bench_population", ROOT / "scripts" / "bench_population.py")
bp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bp)

from fxray.data.folds import Fold  # noqa: E402
from fxray.rl.config import DQNConfig  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.trainer import Trainer  # noqa: E402


def configs(k, batch, envs, hidden, graphs, noise=0.0):
    base = DQNConfig(
        num_envs=envs, batch_size=batch, hidden=hidden, inputs="ridge", demo=1.0, screen_t=0.0, graphs=graphs
    )
    return [
        base.replace(lr=5e-4 * (1 + i % 4), gamma=0.95 + 0.01 * (i % 3), n_step=3 + i % 5, input_noise=noise)
        for i in range(k)
    ]


GROUPS = {  # kernel name fragments -> what they do (the summary after each table)
    "random": ("philox", "distribution", "random", "normal", "uniform"),
    "matmul": ("gemm", "xmma", "cutlass", "splitk", "sm80", "sm90"),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ks", default="3,24")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--noise", type=float, default=0.0, help="input_noise of every member (a sweep's: 0.5-2)")
    a = p.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    bars, batch, envs, hidden = (20_000, 64, 16, 32) if a.quick else (1_000_000, a.batch, 2048, a.hidden)
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    data = DeviceData(bp.random_market(bars), dev)
    vb = bars // 10
    fold = Fold(0, (0, bars - 2 * vb - 200), (bars - 2 * vb - 100, bars - vb - 100), (bars - vb, bars))
    for k in [int(x) for x in a.ks.split(",")]:
        row = {"K": k}
        if cuda:
            for name in ("tf32", "fp32"):
                torch.backends.cuda.matmul.allow_tf32 = name != "fp32"  # as Trainer.run_fold sets it
                tr = Trainer(data, [c.replace(matmul=name) for c in configs(k, batch, envs, hidden, True, a.noise)])
                tr._begin(fold, list(range(k)))
                tr._capture()
                row[f"graph_{name}"] = bp.timed_steps(tr.graph.replay, a.steps, sync) * 1e3
                del tr
                torch.cuda.empty_cache()
        torch.backends.cuda.matmul.allow_tf32 = True
        tr = Trainer(data, configs(k, batch, envs, hidden, False, a.noise))
        tr._begin(fold, list(range(k)))
        row["eager"] = bp.timed_steps(tr.dqn.step, a.steps, sync) * 1e3
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        n = 10
        with profile(activities=acts) as prof:
            for _ in range(n):
                tr.dqn.step()
            sync()
        ev = prof.key_averages()
        attr = "self_cpu_time_total"
        if cuda:
            attr = "self_device_time_total" if hasattr(ev[0], "self_device_time_total") else "self_cuda_time_total"
        kernels = [e for e in ev if getattr(e, attr, 0) > 0 and (not cuda or str(e.device_type).endswith("CUDA"))]
        total = sum(getattr(e, attr) for e in kernels) / n / 1e3
        count = sum(e.count for e in kernels) / n
        row["kernel_ms"], row["kernels"] = total, count
        samples = k * batch
        print(
            f"\nK={k}: "
            + ", ".join(f"{x} {row[x]:.3f} ms/step" for x in row if x not in ("K", "kernels"))
            + f", {count:.0f} kernels/step; samples/s at graph_tf32: "
            + (f"{samples / row['graph_tf32'] * 1e3:.3g}" if cuda else "-"),
            flush=True,
        )
        kernels.sort(key=lambda e: -getattr(e, attr))
        print(f"{'ms/step':>8} {'share':>6} {'calls':>6}  kernel")
        for e in kernels[:28]:
            t = getattr(e, attr) / n / 1e3
            print(f"{t:8.3f} {t / total:6.1%} {e.count / n:6.1f}  {e.key[:110]}")
        groups = dict.fromkeys([*GROUPS, "other"], 0.0)
        calls = dict.fromkeys(groups, 0.0)
        for e in kernels:
            name = e.key.lower()
            g = next((g for g, frags in GROUPS.items() if any(f in name for f in frags)), "other")
            groups[g] += getattr(e, attr) / n / 1e3
            calls[g] += e.count / n
        print(
            "by group: "
            + ", ".join(f"{g} {t:.3f} ms ({t / total:.0%}, {calls[g]:.0f} calls)" for g, t in groups.items())
        )
        del tr
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
