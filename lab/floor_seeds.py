"""The learning floor's measurement for any seeds and any change to the CPU profile's config:
tests/test_learning.py's markets (60k bars, beta 0.09, 3 folds of 15d/3d/3d) and its
pooled_test, one torch thread, one line of JSON a seed.

    OMP_NUM_THREADS=1 python lab/floor_seeds.py '{"steps_per_epoch": 200}' 0,1,2,3,4,5
    OMP_NUM_THREADS=1 python lab/floor_seeds.py '{}' 0,1,2,3 --draws    # seed d on draw d, as the test

Without --draws every seed trains on draw 0 (synth seed 0); with it, seed d trains on draw d.

The first argument is a JSON object of DQNConfig fields ('{}' for the profile as it is).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_learning import MARKET, pooled_test  # noqa: E402  (the test's own market and measurement)

from fxray.data import cache  # noqa: E402
from fxray.data.synth import to_cache  # noqa: E402
from fxray.eval import pooled  # noqa: E402
from fxray.rl import experiment as expmod  # noqa: E402


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    draws = "--draws" in args
    if draws:
        args.remove("--draws")
    if len(args) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        changes, seeds = json.loads(args[0]), [int(s) for s in args[1].split(",")]
        if not isinstance(changes, dict):
            raise ValueError("the first argument must be a JSON object")
        cfg = dataclasses.replace(expmod.load(expmod.default_experiment(), "cpu").config, **changes)
    except (ValueError, TypeError) as e:  # bad JSON, a seed that is not an int, a field DQNConfig lacks
        print(f"floor_seeds.py: error: {e}; e.g. '{{\"steps_per_epoch\": 200}}' 0,1,2", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    markets = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            draw = seed if draws else 0
            if draw not in markets:
                path = Path(tmp) / f"floor{draw}.fxcache"
                to_cache(dataclasses.replace(MARKET, seed=draw), path)
                markets[draw] = cache.open(path)
            t0 = time.perf_counter()
            stats = pooled_test(markets[draw], cfg, seed)
            share = pooled.oracle_share(stats["dqn"], stats["oracle"])
            s = round(time.perf_counter() - t0, 1)
            print(json.dumps({"changes": changes, "draw": draw, "seed": seed, "share": share, "s": s}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
