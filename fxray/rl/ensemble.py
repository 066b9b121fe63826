"""Seed ensembles: S seeds of one config trained as one population, scored as one policy.

    trainer = make_trainer(data, cfg)          # a Trainer, or with cfg.seeds > 1 an EnsembleTrainer
    result = trainer.run_fold(fold, seed)      # FoldResult; with seeds > 1 the ensemble's

With `seeds: S` (dqn.seeds, or `--set seeds=S`) a fold trains S members of the same config
in one fxray.rl.population (member i with seed `member_seeds(seed, S)[i]`; member 0 is the
seed the config would train alone, so S = 1 is today's Trainer). Each member keeps its own
best epoch, as alone. The fold's policy is then the ensemble: at every bar, the mean of the
members' Q-values (the members that finished "ok"), acted on greedily. Its val window gives
the fold's score (what ASHA and Optuna see), its test window the fold's out-of-sample result,
so a config is never judged on one lucky seed; `seed_spread` keeps each member's val and test
Sharpe beside it. The val window chose each member's epoch and now scores their mean: as for
one seed, the val score is in-sample for that choice, and the test window is the verdict.

With a checkpoint directory, an ensemble fold writes one checkpoint per member that finished
"ok" (the members its policy averages): <dir>/fold<k>.m<i>.safetensors, member i's kept
weights, its own metrics in the sidecar and the ensemble's beside them (`"ensemble"`: seeds,
member, val_score, val, test). fxray export takes a fold's members together: its bundle's
policy is the mean of their Q, the policy this fold scored (docs/policy.md).
"""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from fxray.data.folds import Fold
from fxray.eval.backtest import backtest
from fxray.rl.config import TrainConfig
from fxray.rl.device import DeviceData
from fxray.rl.population_trainer import PopulationTrainer
from fxray.rl.trainer import FoldResult, Trainer, abstains, flat_fold, write_checkpoint

SEED_STRIDE = 7919  # member i > 0 trains with seed + i x SEED_STRIDE (a prime: no overlap with fold seeds k)


def member_seeds(seed: int, n: int) -> list[int]:
    return [seed + i * SEED_STRIDE for i in range(n)]


def make_trainer(data: DeviceData, cfg: TrainConfig):
    """The trainer of `cfg`: a Trainer, or an EnsembleTrainer when cfg.seeds > 1."""
    return EnsembleTrainer(data, cfg) if cfg.seeds > 1 else Trainer(data, cfg)


class EnsembleTrainer:
    """cfg.seeds members of `cfg` in one PopulationTrainer; run_fold gives the ensemble's FoldResult."""

    def __init__(self, data: DeviceData, cfg: TrainConfig):
        self.data, self.cfg = data, cfg
        self.population = PopulationTrainer(data, [cfg.replace(seeds=1)] * cfg.seeds)

    def configure(self, cfg: TrainConfig) -> None:
        """Another config of the same shape (its seeds included) in the same slots, in place."""
        self.cfg = cfg
        self.population.configure([cfg.replace(seeds=1)] * cfg.seeds)

    def run_fold(self, fold: Fold, seed: int = 0, log=None, checkpoint_dir=None, stop=None) -> FoldResult:
        """Trainer.run_fold's contract; with `checkpoint_dir`, a checkpoint per member (module doc)."""
        t0 = time.perf_counter()
        if abstains(self.data, fold, self.cfg):  # no member trains: the fold's policy is flat
            return flat_fold(self.data, fold, self.cfg, t0, checkpoint_dir)
        seeds = member_seeds(seed, self.cfg.seeds)
        members = self.population.run_fold(fold, seeds, log=log, stop=(lambda k: stop()) if stop else None)
        result = combine(self.population, self.cfg, fold, seeds, members, t0)
        if checkpoint_dir is not None:
            paths = save_members(checkpoint_dir, self.population, self.cfg, fold, seeds, members, result)
            result.checkpoint = str(paths[0]) if paths else None
        return result


def save_members(directory, population: PopulationTrainer, cfg: TrainConfig, fold: Fold, seeds, members, result):
    """A checkpoint of each "ok" member's kept weights (fold<k>.m<i>); the ensemble's scores in each."""
    ensemble = {"seeds": cfg.seeds, "val_score": result.val_score, "val": result.val, "test": result.test}
    one, paths = cfg.replace(seeds=1), []
    for i, m in enumerate(members):
        if m.status != "ok":
            continue
        extra = {"ensemble": {**ensemble, "member": i, "member_seed": seeds[i]}}
        state = population.algo.state_dict(i)
        paths.append(
            write_checkpoint(directory, one, population.data, state, fold, m, name=f"fold{fold.k}.m{i}", extra=extra)
        )
    return paths


@torch.no_grad()
def ensemble_q(population: PopulationTrainer, window: tuple[int, int], members: list[int]) -> torch.Tensor:
    """(T, 3, 3): the mean over `members` of their Q-values on `window` (their kept weights)."""
    return population.q_all(window, members).mean(0)


def combine(
    population: PopulationTrainer, cfg: TrainConfig, fold: Fold, seeds: list[int], members: list, t0: float
) -> FoldResult:
    """One FoldResult for the ensemble of `members` (the population's FoldResults, in seed order)."""
    spread = {
        "seeds": seeds,
        "status": [m.status for m in members],
        "val_sharpe": [m.val.get("sharpe") for m in members],
        "test_sharpe": [m.test.get("sharpe") for m in members],
    }
    ok = [k for k, m in enumerate(members) if m.status == "ok"]
    first = members[ok[0] if ok else 0]
    result = FoldResult(**{**first.as_dict(), "seed_spread": spread, "checkpoint": None})
    if not ok:  # every member diverged or was cancelled: the fold is what member 0's was
        return result
    data = population.data
    val = backtest(ensemble_q(population, fold.val, ok), data.window(fold.val, cfg.fill), cfg.cost)
    test = backtest(ensemble_q(population, fold.test, ok), data.window(fold.test, cfg.fill), cfg.cost)
    result.status = "ok"
    result.val, result.test = asdict(val.metrics), asdict(test.metrics)
    result.val_periods, result.test_periods = val.periods.as_dict(), test.periods.as_dict()
    result.val_score = population.score(ok[0], val)
    result.test_daily_returns = test.daily_returns.tolist()
    result.epochs_run = max(m.epochs_run for m in members)
    result.timings = {**first.timings, "total_s": time.perf_counter() - t0}
    return result
