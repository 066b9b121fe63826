"""How many tensor ops each part of one population's fold dispatches (issue 50): on a card, the
ops at a population's boundary (fold switch, evaluation, seed ensembles, checkpoints) are launches
the host issues one by one while the GPU waits (~1 s at 0-30 % busy at each boundary, lab/notes.md).
Counted on the CPU through a TorchDispatchMode, with CUDA's batched network path forced
(QNetwork.per_member off; `--per-member`: the CPU's own path): one fold of the default GPU
experiment's last two folds per run, `--trials` trials of `--seeds` seeds, a tiny learner
(two epochs of a step: the step itself is one CUDA graph replay on a card, counted apart).

    python lab/op_count.py --trials 41 --seeds 3 --hidden 128     # the default sweep's first shape: ~2 min
    python lab/op_count.py --trials 4 --seeds 2 --hidden 16       # the script itself

Views (select, slice, view, detach, ...: `OpOverload.is_view`) launch no kernel but pass through
the dispatcher: the table gives the ops, and of them the views. Syncs: ops that read a value back
(item, nonzero, ...); on the CPU these include the host's own draws (initial_weights), so they
bound a card's syncs from above. A probe: its numbers go to the note, not to a test.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

from torch.utils._python_dispatch import TorchDispatchMode

from fxray.data import cache, synth
from fxray.data.folds import make_folds
from fxray.rl import demo, experiment, frontend
from fxray.rl import dqn as dqn_mod
from fxray.rl import network as net_mod
from fxray.rl import trainer as tr_mod
from fxray.rl.device import DeviceData
from fxray.rl.overrides import set_overrides

SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"}


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.phase = ["other"]
        self.ops, self.syncs, self.views = collections.Counter(), collections.Counter(), collections.Counter()
        self.names = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, phase = func.__name__.split(".")[0], self.phase[-1]
        self.ops[phase] += 1
        self.names[phase][name] += 1
        self.syncs[phase] += name in SYNCS
        self.views[phase] += func.is_view
        return func(*args, **(kwargs or {}))


def labelled(counter, owner, attr, label):
    """`owner.attr` counted under `label` (and what it calls, unless labelled itself), but inside
    the learner step, which counts as a whole."""
    f = getattr(owner, attr)

    def g(*a, **k):
        counter.phase.append(counter.phase[-1] if counter.phase[-1] == "learner step" else label)
        try:
            return f(*a, **k)
        finally:
            counter.phase.pop()

    setattr(owner, attr, g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=41)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--per-member", action="store_true", help="the CPU's own network path")
    a = p.parse_args()
    count = Count()
    for owner, attr, label in (
        (tr_mod.Trainer, "_begin", "begin: the rest"),
        (DeviceData, "set_fold", "fold switch"),
        (frontend, "fit", "begin: front end"),
        (demo, "fit", "begin: demonstrator"),
        (dqn_mod.DQN, "collect", "begin: warm-up collects"),
        (dqn_mod, "initial_weights", "begin: host init"),
        (tr_mod.Trainer, "evaluate", "evaluation"),
        (tr_mod.Trainer, "_ensembles", "seed ensembles"),
        (tr_mod, "abstains", "screen"),
        (dqn_mod.DQN, "step", "learner step"),
    ):
        labelled(count, owner, attr, label)
    init = net_mod.QNetwork.__init__

    def batched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.per_member = a.per_member

    net_mod.QNetwork.__init__ = batched
    sets = ["epochs=2", "steps_per_epoch=1", "num_envs=16", "batch_size=16", "select_from=0", "keep=best"]
    exp = experiment.load("experiments/default.yaml", "gpu", set_overrides(sets))
    market = cache.open(exp.data_path or synth.ensure_default(exp.synth))
    data = DeviceData(market, "cpu", dtype=exp.config.dtype)
    cfgs = [exp.config.replace(seeds=a.seeds, lr=1e-3 * (1 + i % 3), hidden=a.hidden) for i in range(a.trials)]
    trainer = tr_mod.Trainer(data, cfgs)
    for fold in make_folds(market.ts, exp.folds)[-2:]:
        for c in (count.ops, count.syncs, count.views, count.names):
            c.clear()
        with tempfile.TemporaryDirectory() as tmp, count:
            t0 = time.perf_counter()
            dirs = [f"{tmp}/t{j}" for j in range(a.trials)]
            results = trainer.run_fold(fold, list(range(a.trials)), checkpoint_dirs=dirs)
            wall = time.perf_counter() - t0
        trained = sum(not r.abstained for r in results)
        print(f"fold {fold.k}: {a.trials} trials x {a.seeds} seeds, {trained} trained, wall {wall:.1f} s (CPU)")
        print(f"  {'part':>23} {'ops':>7} {'views':>6} {'syncs':>6}  most dispatched")
        for phase, n in count.ops.most_common():
            top = ", ".join(f"{k} {v}" for k, v in count.names[phase].most_common(4))
            print(f"  {phase:>23} {n:>7} {count.views[phase]:>6} {count.syncs[phase]:>6}  {top}")
        rest = [p for p in count.ops if p != "learner step"]
        print(f"  {'all but the step':>23} {sum(count.ops[p] for p in rest):>7} {sum(count.views[p] for p in rest):>6}")


if __name__ == "__main__":
    main()
