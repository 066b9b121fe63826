"""One fold of the strong planted market (tests/conftest.py's STRONG) with the default DQNConfig
at cost 1e-5, seeds 0..N-1, on a device: the test Sharpe of each seed. Run it with the tree of
another commit first on sys.path to compare that learner's draws with this one's:

    python lab/gpu_learning_check.py --device cuda --seeds 6             # this tree
    PYTHONPATH=/tmp/old python lab/gpu_learning_check.py --device cuda   # another (its fxray first)
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--seeds", type=int, default=6)
p.add_argument("--json")
args = p.parse_args()

import fxray  # noqa: E402
from fxray.data import cache  # noqa: E402
from fxray.data.folds import FoldSpec, make_folds  # noqa: E402
from fxray.data.synth import SynthSpec, to_cache  # noqa: E402
from fxray.rl.config import DQNConfig  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.trainer import Trainer  # noqa: E402

STRONG = dict(beta=0.10, persistence=0.95, ofi_noise=0.0, ofi_span=1)  # tests/conftest.py's
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "strong.fxcache"
    to_cache(SynthSpec(n_bars=60_000, seed=0, **STRONG), path)
    market = cache.open(path)
    fold = make_folds(market.ts, FoldSpec(max_folds=1))[0]
    data = DeviceData(market, args.device)
    cfg = DQNConfig(cost=1e-5)
    out = []
    for seed in range(args.seeds):
        try:
            (r,) = Trainer(data, [cfg]).run_fold(fold, [seed])
        except (TypeError, AttributeError):  # the single-config Trainer of earlier trees
            r = Trainer(data, cfg).run_fold(fold, seed=seed)
        out.append(r.test["sharpe"])
        print(f"seed {seed}: test Sharpe {r.test['sharpe']:+.2f} (best epoch {r.best_epoch})", flush=True)
sd = statistics.stdev(out) if len(out) > 1 else float("nan")
print(f"{fxray.__file__}: mean {statistics.mean(out):+.2f} sd {sd:.2f} over {len(out)} seeds")
if args.json:
    Path(args.json).write_text(json.dumps(out))
