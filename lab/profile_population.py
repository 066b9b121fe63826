"""Where a population step's time goes: torch.profiler's top CUDA kernels of K members' eager
step, and the eager and graphed step times, for K = 1, 2, 4, 16 at batch 8192 x 2048 agents
(the default GPU profile's per-member size). CUDA only (docs/benchmarks.md, "Populations").

    python lab/profile_population.py            # K = 1 2 4 16
    python lab/profile_population.py 2 8        # these K
    python lab/profile_population.py --fp32     # FP32 matmuls (how docs/benchmarks.md's profile ran)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # bench_population stays a script

from bench_population import members, random_market, timed_steps  # noqa: E402

from fxray.data.folds import Fold  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.population_trainer import PopulationTrainer  # noqa: E402


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("profile_population: needs a CUDA device", file=sys.stderr)
        return 2
    dev, n = torch.device("cuda"), 1_000_000
    data = DeviceData(random_market(n), dev)
    fold = Fold(0, (0, n - 200_200), (n - 200_100, n - 100_100), (n - 100_000, n))

    def sync():
        torch.cuda.synchronize(dev)

    fp32 = "--fp32" in argv
    for k in [int(x) for x in argv if x != "--fp32"] or [1, 2, 4, 16]:
        cfgs = members(k, 8192, 2048, 256, 100)
        pop = PopulationTrainer(data, cfgs)
        torch.backends.cuda.matmul.allow_tf32 = not fp32  # run_fold sets it from dqn.matmul (tf32)
        pop._begin(fold, list(range(k)))
        eager = timed_steps(pop.algo.step, 20, sync)
        pop._capture()
        graphed = timed_steps(pop.graph.replay, 50, sync)
        print(f"\n=== K={k}: eager {eager * 1e3:.2f} ms, graphed {graphed * 1e3:.2f} ms a step", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                pop.algo.step()
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=90))
        del pop
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
