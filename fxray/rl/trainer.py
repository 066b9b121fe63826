"""Train one walk-forward fold: epochs of collect + learn, val each epoch, test once.

    trainer = Trainer(data, cfg)          # networks, replay, env; CUDA graph captured once
    result = trainer.run_fold(fold, seed)  # reuses all of it: a fold switch is in-place
    result = train_fold(data, fold, cfg, seed)  # the same, for one-off use

Inside an epoch nothing talks to the host: `steps_per_epoch` replays of the
captured (or eager) collect+learn step. At the epoch end one read of the loss
accumulators and one backtest of the greedy policy on the val window (each one
host sync). The selected epoch's weights are kept on device; the test window is
evaluated once, with them. Divergence (non-finite loss or Q) ends the fold with
status "diverged" instead of raising, and such a fold has no val or test result.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from fxray.data.folds import Fold
from fxray.eval import baselines, pooled
from fxray.eval.backtest import BacktestResult, backtest, buy_and_hold, evaluate
from fxray.eval.metrics import summarize
from fxray.rl import algorithm, frontend
from fxray.rl.algorithm import Algorithm
from fxray.rl.config import TrainConfig
from fxray.rl.device import DeviceData
from fxray.rl.markers import marker

Q_LIMIT = 1e6  # |Q| beyond this (scaled reward units) counts as divergence
EVAL_CHUNK = 262_144  # bars per Q-network forward in evaluation (bounds activation memory)


@dataclass
class FoldResult:
    fold: dict  # Fold.as_dict()
    status: str  # "ok" | "diverged" | "cancelled" (stop() said so; not evaluated)
    best_epoch: int  # 0-based; -1 if no epoch finished
    epochs_run: int
    val: dict  # metrics of the best epoch on the val window
    test: dict  # metrics of the best weights on the test window
    baselines: dict  # {"buy_and_hold": {...}, "flat": {...}} on the test window
    curve: list = field(default_factory=list)  # per epoch: loss, val_sharpe, epoch_s, eps
    timings: dict = field(default_factory=dict)  # seconds: fold_switch, train, eval, total
    adx: float = float("nan")  # mean raw ADX(14) over the train slice (the fold's "difficulty")
    test_daily_returns: list = field(default_factory=list)  # for equity curves (per session day)
    checkpoint: str | None = None
    val_score: float = float("nan")  # the selected epoch's score on the val window
    # hourly returns (fxray.eval.backtest.PeriodReturns.as_dict()), what fxray.eval.pooled pools:
    val_periods: dict = field(default_factory=dict)  # of the kept weights on the val window
    test_periods: dict = field(default_factory=dict)  # ... and on the test window
    baseline_periods: dict = field(default_factory=dict)  # {"buy_and_hold": {"val": ..., "test": ...}, ...}
    # seeds > 1 (fxray.rl.ensemble): the members' seeds, statuses and val / test Sharpe
    seed_spread: dict = field(default_factory=dict)
    abstained: bool = False  # not trained: the checked screen kept nothing (TrainConfig abstain)

    def as_dict(self) -> dict:
        return asdict(self)


class Trainer:
    """Everything one config needs on one device, built once and reused across folds."""

    def __init__(self, data: DeviceData, cfg: TrainConfig):
        self.data, self.cfg = data, cfg
        self.use_graph = cfg.graphs and data.device.type == "cuda"
        self.algo: Algorithm = algorithm.build(data, cfg)  # agents, replay, networks, optimizer
        self.best_params = [p.detach().clone() for p in self.algo.params]
        self.graph: torch.cuda.CUDAGraph | None = None

    # --- the hot step ----------------------------------------------------------------
    def _step(self) -> None:
        """One collect + learn step of the algorithm (no host sync)."""
        self.algo.step()

    def _capture(self) -> None:
        """Record `_step` in a CUDA graph (after warm-up iterations on a side stream)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # builds optimizer state and cuBLAS workspaces
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()

    def _begin(self, fold: Fold, seed: int) -> None:
        """`fold` active on the data, then a fresh start of the algorithm on it."""
        torch.manual_seed(seed)
        self.data.set_fold(fold)
        self.algo.begin(seed)

    # --- evaluation --------------------------------------------------------------------
    @torch.no_grad()
    def q_all(self, window: tuple[int, int]) -> torch.Tensor:
        """(T, 3, 3) Q-values for bars [start, end-1) of a window (bars with a next bar)."""
        return torch.cat([self.algo.q_all(self.data.states(t)) for t in window_bars(self.data, window)])

    def evaluate(self, window: tuple[int, int]) -> BacktestResult:
        return backtest(self.q_all(window), self.data.window(window, self.cfg.fill), self.cfg.cost)

    def score(self, result: BacktestResult) -> float:
        """The selection score of one window (fxray.eval.pooled.score of its hourly returns)."""
        return pooled.score(
            pooled.pooled([result.periods.as_dict()], self.cfg.cost, self.data.calendar.periods_per_year)
        )

    # --- one fold ----------------------------------------------------------------------
    def run_fold(self, fold: Fold, seed: int = 0, log=None, checkpoint_dir=None, stop=None) -> FoldResult:
        """`stop()`, asked before every step, ends the fold at once with status "cancelled"
        (a sweep uses it for a fold it started ahead of a trial that is then stopped).

        The kept weights are those of the epoch `cfg.select` picks: "val_score", the best
        score on the fold's chooser window (hourly pooled Sharpe, shrunk for thin evidence;
        stops after `patience` epochs without a better one), or "last", the last epoch. The
        chooser is the val window, or the fold's holdout window where it has one: then val
        scores the kept weights once, as test does, and `val_score` is that score."""
        cfg, sync = self.cfg, self.data.synchronize
        # matmul precision is process-wide in torch: set it for whichever trainer runs now
        torch.backends.cuda.matmul.allow_tf32 = cfg.matmul == "tf32"
        t_start = time.perf_counter()
        if abstains(self.data, fold, cfg):
            return flat_fold(self.data, fold, cfg, t_start, checkpoint_dir)
        self._begin(fold, seed)
        sync()
        t_switch = time.perf_counter() - t_start
        if self.use_graph and self.graph is None:
            self._capture()
            self._begin(fold, seed)  # the capture's warm-up iterations touched weights and replay
        best_score, best_epoch, bad_epochs, status = -math.inf, -1, 0, "ok"
        best_val, curve, train_s, eval_s = None, [], 0.0, 0.0
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            self.algo.reset_epoch_stats()
            for _ in range(cfg.steps_per_epoch):
                if stop is not None and stop():  # a host-side flag: no device sync
                    return FoldResult(
                        fold=fold.as_dict(),
                        status="cancelled",
                        best_epoch=-1,
                        epochs_run=len(curve),
                        val={},
                        test={},
                        baselines={},
                        curve=curve,
                        timings={"total_s": time.perf_counter() - t_start},
                    )
                self.graph.replay() if self.graph is not None else self._step()
            # host sync: the epoch's loss, |Q| max and epsilon, three scalars
            loss_sum, q_max, eps = self.algo.epoch_stats().tolist()
            t1 = time.perf_counter()
            loss = loss_sum / (cfg.steps_per_epoch * cfg.updates_per_step)
            if not (math.isfinite(loss) and math.isfinite(q_max) and q_max < Q_LIMIT):
                status = "diverged"
                curve.append(
                    {
                        "epoch": epoch,
                        "loss": loss,
                        "q_max": q_max,
                        "val_sharpe": float("nan"),
                        "val_score": float("nan"),
                        "epoch_s": t1 - t0,
                        "eps": eps,
                    }
                )
                if log:
                    log(f"fold {fold.k} epoch {epoch}: diverged (loss {loss:.3g}, |Q| max {q_max:.3g})")
                break
            val = self.evaluate(fold.chooser)
            score = self.score(val)
            t2 = time.perf_counter()
            train_s, eval_s = train_s + (t1 - t0), eval_s + (t2 - t1)
            curve.append(epoch_record(epoch, loss, q_max, val, score, eps, (t0, t1, t2)))
            if log:
                log(
                    f"fold {fold.k} epoch {epoch}: loss {loss:.4f}  val score {score:+.2f}  eps {eps:.2f}  "
                    f"{t2 - t0:.2f}s"
                )
            if epoch < cfg.select_from:  # scored, never kept; patience counts from select_from
                continue
            if cfg.select == "last" or score > best_score:
                best_score, best_epoch, best_val, bad_epochs = score, epoch, val, 0
                for b, p in zip(self.best_params, self.algo.params):
                    b.copy_(p)
            else:
                bad_epochs += 1
                if bad_epochs >= cfg.patience:
                    break
        result = FoldResult(
            fold=fold.as_dict(),
            status=status,
            best_epoch=best_epoch,
            epochs_run=len(curve),
            val={},
            test={},
            baselines={},
            curve=curve,
            adx=self.data.adx_mean(fold.train),
        )
        t3 = time.perf_counter()
        self._baselines(fold, result)
        if best_val is not None and status == "ok":
            for b, p in zip(self.best_params, self.algo.params):
                p.data.copy_(b)
            if fold.holdout is not None:  # val was not the chooser: it scores the kept weights now
                best_val = self.evaluate(fold.val)
                best_score = self.score(best_val)
            test = self.evaluate(fold.test)
            result.val, result.test = asdict(best_val.metrics), asdict(test.metrics)
            result.val_periods, result.test_periods = best_val.periods.as_dict(), test.periods.as_dict()
            result.val_score = best_score
            result.test_daily_returns = test.daily_returns.tolist()
            if checkpoint_dir is not None:
                result.checkpoint = str(save_checkpoint(checkpoint_dir, self, fold, result))
        t4 = time.perf_counter()
        result.timings = {
            "fold_switch_s": t_switch,
            "train_s": train_s,
            "eval_s": eval_s + (t4 - t3),
            "total_s": t4 - t_start,
        }
        return result

    def _baselines(self, fold: Fold, result: FoldResult) -> None:
        result.baselines, result.baseline_periods = fold_baselines(
            self.data, fold, self.cfg.cost, self.cfg.fill, getattr(self.cfg, "screen_t", 0.0)
        )

    def _references(self, fold: Fold) -> tuple[dict, dict]:
        return references(self.data, fold, self.cfg.cost, self.cfg.fill, getattr(self.cfg, "screen_t", 0.0))


def window_bars(data: DeviceData, window: tuple[int, int], chunk: int = EVAL_CHUNK) -> list[torch.Tensor]:
    """The bars [start, end - 1) of `window` (those with a next bar) as index tensors on the
    data's device, `chunk` at a time: what every evaluation feeds its Q-network."""
    start, end = window[0], window[1] - 1
    return [torch.arange(s, min(s + chunk, end), device=data.device) for s in range(start, end, chunk)]


def fold_baselines(data: DeviceData, fold: Fold, cost: float, fill: str, screen_t: float = 0.0) -> tuple[dict, dict]:
    """The reference policies of the fold's windows: per-window metrics (test) for tables,
    and their hourly returns on val and test for the pooled statistics beside the policy's.
    They depend on the fold, the cost, the fill and the screen only: computed once per worker."""
    key = (fold.as_dict().__repr__(), cost, fill, screen_t)
    if key not in data.references:
        data.references[key] = references(data, fold, cost, fill, screen_t)
    return data.references[key]


def references(data: DeviceData, fold: Fold, cost: float, fill: str, screen_t: float = 0.0) -> tuple[dict, dict]:
    """buy_and_hold and flat; the supervised rule ("ridge": all the inputs), with `screen_t` > 0
    the same rule on the inputs of the learner's checked screen ("screened": its demonstrator's
    rule, fxray.rl.demo), and, on a planted market, the oracle (the same rule on the columns that
    carry the signal, in the hours it is on; fxray.eval.baselines), all fitted on the train
    slice only."""
    windows = {w: data.window(getattr(fold, w), fill) for w in ("val", "test")}
    runs = {"buy_and_hold": {w: buy_and_hold(windows[w], cost) for w in windows}}
    a, b = fold.train[0], fold.train[1] - 1  # train bars with a next bar
    train = data.window(fold.train, fill)
    rules = {"ridge": (None, None)}
    if screen_t > 0:
        rules["screened"] = (frontend.screened_inputs(data, fold, cost, fill, screen_t), None)
    if data.oracle is not None:
        rules["oracle"] = data.oracle
    for name, (columns, hours) in rules.items():
        x = data.states(torch.arange(a, b, device=data.device))
        rule = baselines.fit_rule(
            x, train.fresh, cost, carry=train.carry, columns=columns, gate=data.hour_gate(a, b, hours)
        )
        runs[name] = {}
        for w in windows:
            s, e = getattr(fold, w)[0], getattr(fold, w)[1] - 1
            x = data.states(torch.arange(s, e, device=data.device))
            runs[name][w] = evaluate(rule.positions(x, data.hour_gate(s, e, hours)), windows[w], cost)
    table = {name: asdict(run["test"].metrics) for name, run in runs.items()}
    table["flat"] = asdict(summarize(np.zeros(runs["buy_and_hold"]["test"].metrics.n_days)))
    periods = {name: {w: r.periods.as_dict() for w, r in run.items()} for name, run in runs.items()}
    return table, periods


def abstains(data: DeviceData, fold: Fold, cfg: TrainConfig) -> bool:
    """`cfg.abstain` and the checked screen keeps no input on `fold`'s train slice: the fold is
    not trained, its policy is flat (flat_fold). Leaves `fold` active on `data` (set only if
    another was: a worker's population asks once per request of the same fold)."""
    if not getattr(cfg, "abstain", False):
        return False
    if data.fold != fold:
        data.set_fold(fold)
    return frontend.screened_inputs(data, fold, cfg.cost, cfg.fill, cfg.screen_t).numel() == 0


def flat_fold(data: DeviceData, fold: Fold, cfg: TrainConfig, t_start: float, checkpoint_dir=None) -> FoldResult:
    """The FoldResult of a fold the learner abstains on: no epoch (best_epoch -1, epochs_run 0,
    no checkpoint), the flat policy scored on val and test as any policy is (its hourly returns,
    all 0, enter the pooled statistics), and the fold's references beside it. With
    `checkpoint_dir`, no weights but a marker, <dir>/fold<k>.abstained.json (the config, the
    fold, its val and test), so that an export of the directory knows the fold said "flat"."""
    result = FoldResult(
        fold=fold.as_dict(),
        status="ok",
        best_epoch=-1,
        epochs_run=0,
        val={},
        test={},
        baselines={},
        adx=data.adx_mean(fold.train),
        abstained=True,
    )
    result.baselines, result.baseline_periods = fold_baselines(data, fold, cfg.cost, cfg.fill, cfg.screen_t)
    runs = {}
    for w in ("val", "test"):
        window = getattr(fold, w)
        flat = torch.zeros(window[1] - 1 - window[0], dtype=torch.int8, device=data.device)
        runs[w] = evaluate(flat, data.window(window, cfg.fill), cfg.cost)
    result.val, result.test = asdict(runs["val"].metrics), asdict(runs["test"].metrics)
    result.val_periods, result.test_periods = runs["val"].periods.as_dict(), runs["test"].periods.as_dict()
    result.val_score = pooled.score(pooled.pooled([result.val_periods], cfg.cost, data.calendar.periods_per_year))
    result.test_daily_returns = runs["test"].daily_returns.tolist()
    result.timings = {"fold_switch_s": 0.0, "train_s": 0.0, "eval_s": 0.0, "total_s": time.perf_counter() - t_start}
    if checkpoint_dir is not None:
        meta = {
            "abstained": True,
            "config": cfg.as_dict(),
            "fold": fold.as_dict(),
            "val": result.val,
            "test": result.test,
        }
        text = json.dumps(meta, indent=1)
        write_atomically(marker(checkpoint_dir, fold.k), lambda p: Path(p).write_text(text))
    return result


def write_atomically(path: Path, write) -> None:
    """`write(tmp)` to a temporary file beside `path`, then renamed to it: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def epoch_record(epoch: int, loss: float, q_max: float, val, score: float, eps: float, times) -> dict:
    """One epoch of a fold's curve (FoldResult.curve); `times`: (start, trained, evaluated)."""
    t0, t1, t2 = times
    return {
        "epoch": epoch,
        "loss": loss,
        "q_max": q_max,
        "val_sharpe": val.metrics.sharpe,
        "val_score": score,
        "epoch_s": t2 - t0,
        "train_s": t1 - t0,
        "val_s": t2 - t1,
        "eps": eps,
    }


def train_fold(
    data: DeviceData, fold: Fold, config: TrainConfig, seed: int = 0, log=None, checkpoint_dir=None
) -> FoldResult:
    """Train `config` on one fold of `data` (a fresh Trainer; reuse a Trainer across folds)."""
    return Trainer(data, config).run_fold(fold, seed, log=log, checkpoint_dir=checkpoint_dir)


def save_checkpoint(directory, trainer: Trainer, fold: Fold, result: FoldResult) -> Path:
    """Best weights as safetensors + a JSON sidecar (config, fold, epoch, metrics, and the fold's
    train-slice normalisation that the weights expect: a policy needs it to run), atomically."""
    return write_checkpoint(directory, trainer.cfg, trainer.data, trainer.algo.state_dict(), fold, result)


def write_checkpoint(
    directory,
    cfg: TrainConfig,
    data: DeviceData,
    state: dict,
    fold: Fold,
    result: FoldResult,
    *,
    name: str | None = None,
    extra: dict | None = None,
) -> Path:
    """save_checkpoint of the weights `state` that `cfg` trained on `data`'s fold (a population
    member's too), as <directory>/<name or fold<k>>.safetensors; `extra` joins the sidecar."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / (name or f"fold{fold.k}")
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    meta = {
        "config": cfg.as_dict(),
        "fold": fold.as_dict(),
        "best_epoch": result.best_epoch,
        "val": result.val,
        "test": result.test,
        "n_inputs": data.n_inputs,
        "val_score": result.val_score,
        # float32 values as JSON floats: exact round trip (fxray.policy.export reads them)
        "normalisation": {"mean": data.mean.tolist(), "inv_std": data.inv_std.tolist()},
        **(extra or {}),
    }
    for suffix, write in (
        (".safetensors", lambda p: save_file(tensors, p)),
        (".json", lambda p: Path(p).write_text(json.dumps(meta, indent=1))),
    ):
        write_atomically(Path(str(stem) + suffix), write)
    return Path(str(stem) + ".safetensors")  # not with_suffix: a member's stem fold<k>.m<i> has a dot


def load_checkpoint(path) -> tuple[dict, dict]:
    """(state_dict tensors, metadata) of a checkpoint written by save_checkpoint."""
    from safetensors.torch import load_file

    path = Path(path)
    return load_file(str(path)), json.loads(path.with_suffix(".json").read_text())
