"""Train one walk-forward fold: the one way a fold is trained, alone, as a seed ensemble, or as
a sweep's population of trials.

    trainer = Trainer(data, [cfg_a, cfg_b, ...])                    # trials of one shape; built once
    results = trainer.run_fold(fold, seeds=[seed_a, seed_b, ...])   # one FoldResult per trial

A trial of `seeds: S` is S members of fxray.rl.dqn.DQN (member i trains with
`member_seeds(seed, S)[i]`; member 0 with the trial's seed), and every trial of a Trainer is
in one DQN: K = the trials' seeds added up, one step (one CUDA graph) for all. Each member
keeps its own best epoch (select_from, patience; with `keep: won` only one that beat flat on
the fold's chooser window behind enough trades and days, fxray.eval.selection.keeps). A trial
of one seed is its member's result; a seed ensemble's policy is the mean of the Q-values of its
members that kept an epoch (with `keep: won` kept only if it too passes `keeps`), scored on val
(the fold's score) and test, with each member's Sharpe in `seed_spread`.

Inside an epoch nothing talks to the host: `steps_per_epoch` replays of the captured (or
eager) collect+learn step. At the epoch end one read of the (K, 3) loss accumulators and one
batched backtest of every running member's val window. A member that stops (patience,
divergence, `stop`) is masked; the loop ends when none runs. The kept weights are evaluated
on the test window once. A member whose loss or |Q| leaves the bound its rewards allow
(`q_bound`) has diverged: status "diverged", no val or test result, never scored.

Where the learner abstains (dqn.abstain and a checked screen that keeps no input on the
fold's train slice: decided here, once per fold) nothing is trained: each trial's policy is
flat, scored as any policy (`flat_fold`). A trained fold that keeps no epoch is flat the same
way: `abstained`, best_epoch -1, the flat policy scored, a marker for its checkpoint.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch

from fxray.data.folds import Fold
from fxray.eval import pooled
from fxray.eval.backtest import BacktestResult, backtest_many, evaluate
from fxray.eval.selection import keeps
from fxray.rl import checkpoint
from fxray.rl.config import ConfigError, DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.dqn import DQN
from fxray.rl.references import abstains, references

EVAL_CHUNK = 262_144  # member-bars per Q-network forward in evaluation (bounds activation memory)
SEED_STRIDE = 7919  # member i > 0 trains with seed + i x SEED_STRIDE (a prime: no overlap with fold seeds k)
Q_SLACK = 10.0  # |Q| may exceed the bound its rewards allow by this factor before it has diverged


@dataclass
class FoldResult:
    fold: dict  # Fold.as_dict()
    status: str  # "ok" | "diverged" | "cancelled" (stop() said so; not evaluated)
    best_epoch: int  # 0-based; -1 if no epoch was kept
    epochs_run: int
    val: dict  # metrics of the kept weights on the val window
    test: dict  # metrics of the kept weights on the test window
    baselines: dict  # the references' metrics on the test window (`references`)
    curve: list = field(default_factory=list)  # per epoch: loss, q_max, val_sharpe, val_score, eps, times
    timings: dict = field(default_factory=dict)  # seconds: fold_switch, train, eval, total
    checkpoint: str | None = None
    val_score: float = float("nan")  # the kept weights' score on the val window
    # hourly returns (fxray.eval.backtest.PeriodReturns.as_dict()), what fxray.eval.pooled pools:
    val_periods: dict = field(default_factory=dict)
    test_periods: dict = field(default_factory=dict)
    baseline_periods: dict = field(default_factory=dict)  # {"ridge": {"val": ..., "test": ...}, ...}
    seed_spread: dict = field(default_factory=dict)  # seeds > 1: the members' seeds, statuses, Sharpes
    abstained: bool = False  # flat: not trained (dqn.abstain), or no epoch kept (selection.keeps)

    def as_dict(self) -> dict:
        """Its fields, not copied: a population's results share their fold's references, and a deep
        copy of each (dataclasses.asdict: their hourly returns, object by object) ran in a worker's
        device thread while the GPU waited. Ray's return and the JSON writers copy them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def scored(self, val: BacktestResult, test: BacktestResult, val_score: float) -> None:
        """The policy's backtests on val and test (metrics, hourly returns), its score."""
        self.val, self.test = asdict(val.metrics), asdict(test.metrics)
        self.val_periods, self.test_periods = val.periods.as_dict(), test.periods.as_dict()
        self.val_score = val_score


class CaptureError(RuntimeError):
    """A CUDA graph capture failed. The trainer is not to be reused (its members' generators may
    be left mid-capture); a fresh one may capture (fxray.sweep.gather)."""


def q_bound(cfg: DQNConfig, max_abs_return: float) -> float:
    """The largest |Q| (scaled reward units) a member may reach before it has diverged: Q_SLACK
    times the discounted sum of the largest reward the fold's train slice allows, a move of the
    largest bar return less two units of cost, for ever: r_max x reward_scale / (1 - gamma)."""
    r_max = (max_abs_return + 2 * cfg.cost) * cfg.reward_scale
    return Q_SLACK * r_max / max(1.0 - cfg.gamma, 1e-6)


class Trainer:
    """A DQN of the trials' members and its CUDA graph on one device, built once, reused across folds."""

    def __init__(self, data: DeviceData, cfgs: list[DQNConfig]):
        self.data = data
        self._set(cfgs)
        self.dqn = DQN(data, self.members)
        self.use_graph = self.cfgs[0].graphs and data.device.type == "cuda"
        self.best_params = [p.detach().clone() for p in self.dqn.params]
        self.graph: torch.cuda.CUDAGraph | None = None

    def _set(self, cfgs: list[DQNConfig]) -> None:
        self.cfgs = list(cfgs)
        # trial j's members are slots offsets[j] .. offsets[j] + seeds_j - 1
        self.members = [c.replace(seeds=1) for c in self.cfgs for _ in range(c.seeds)]
        self.offsets = np.cumsum([0] + [c.seeds for c in self.cfgs]).tolist()

    def configure(self, cfgs: list[DQNConfig]) -> None:
        """Other trials of the same shape in the same slots, in place (a sweep's next configs). The
        captured graph is kept unless the step's structure changed (DQN.configure)."""
        if [c.seeds for c in cfgs] != [c.seeds for c in self.cfgs]:
            raise ConfigError("dqn.seeds: a trainer's trials keep their seeds (build another trainer)")
        self._set(cfgs)
        if self.dqn.configure(self.members):
            self.graph = None

    # --- the hot step ------------------------------------------------------------------
    def _capture(self) -> None:
        """Record DQN.step in a CUDA graph (after warm-up iterations on a side stream)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # builds optimizer state and cuBLAS workspaces
                self.dqn.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # each member draws from its own generator: the graph must advance all of them on replay
        for g in self.dqn.generators:
            self.graph.register_generator_state(g)
        # In a sweep this runs in the Gatherer's device thread while the worker's other threads
        # wait (fxray.sweep.gather). A garbage collection one of them set off during the capture
        # could free an evicted trainer's graph and memory there (cudaFree: an implicit sync that
        # invalidates the capture). So the collector waits until the capture ends, and the
        # capture checks only its own thread.
        enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.dqn.step()
        except Exception as e:  # the graph and the members' generators are unusable now
            self.graph = None
            raise CaptureError(f"CUDA graph capture of {len(self.members)} members failed: {e}") from e
        finally:
            if enabled:
                gc.enable()

    def _begin(self, fold: Fold, seeds: list[int]) -> None:
        torch.manual_seed(seeds[0])  # the global generators (the members draw from their own)
        self.data.set_fold(fold)
        self.dqn.begin(seeds)

    # --- evaluation --------------------------------------------------------------------
    @torch.no_grad()
    def q_all(self, window: tuple[int, int], members: list[int]) -> torch.Tensor:
        """(M, T, 3, 3) Q-values of `members` for bars [start, end-1) of a window."""
        chunk, net = max(1, EVAL_CHUNK // len(members)), self.dqn.q_network
        params = net.plain(members)  # folded once for the window's chunks
        bars = window_bars(self.data, window, chunk)
        return torch.cat([net.q_plain(self.data.states(t).expand(len(members), -1, -1), params) for t in bars], 1)

    def evaluate(self, window: tuple[int, int], members: list[int]) -> dict[int, BacktestResult]:
        """The greedy backtest of each of `members` over `window`, in one pass."""
        costs = [self.members[m].cost for m in members]
        results = backtest_many(self.q_all(window, members), self.data.window(window, self.cfgs[0].fill), costs)
        return dict(zip(members, results))

    # --- one fold ----------------------------------------------------------------------
    def run_fold(self, fold: Fold, seeds: list[int], log=None, checkpoint_dirs=None, stop=None) -> list[FoldResult]:
        """One FoldResult per trial (seeds[j], checkpoint_dirs[j]). `stop(j)`, asked before every
        step for each running trial, ends trial j's fold at once with status "cancelled" (its
        members masked: the others go on).

        A member keeps the weights of its best-scoring epoch on the fold's chooser window from
        select_from on (hourly pooled Sharpe, shrunk for thin evidence; patience epochs without
        a better one stop it); with `keep: won` only one that beat flat there behind enough
        trades and days (fxray.eval.selection.keeps), and with none its policy is flat. The chooser is the val window,
        or the fold's holdout window where it has one: then val scores the kept weights once,
        as test does."""
        dirs = checkpoint_dirs or [None] * len(self.cfgs)
        # matmul precision is process-wide in torch: set it for whichever trainer runs now
        torch.backends.cuda.matmul.allow_tf32 = self.cfgs[0].matmul == "tf32"
        t_start = time.perf_counter()
        if abstains(self.data, fold, self.cfgs[0]):  # screen_t and abstain are shared by shape
            return flat_fold(self.data, fold, self.cfgs, t_start, dirs)
        trial_of = [j for j, c in enumerate(self.cfgs) for _ in range(c.seeds)]
        mseeds = [seed + i * SEED_STRIDE for c, seed in zip(self.cfgs, seeds) for i in range(c.seeds)]
        members = self._train(fold, mseeds, log, None if stop is None else (lambda m: stop(trial_of[m])), t_start)
        # seeds is a shape field: every trial here is a seed ensemble, or none is
        ensembles = self._ensembles(fold, mseeds, members, t_start) if self.cfgs[0].seeds > 1 else None
        # the checkpoints' weights and normalisation on the host in one copy each, not one a member;
        # no host sync where nothing is saved
        if any(d is not None for d in dirs):
            weights = self.dqn.q_network.host_states(range(len(self.members)))
            norm = (self.data.mean.cpu(), self.data.inv_std.cpu(), self.data.n_inputs)
        results = []
        for j, cfg in enumerate(self.cfgs):
            lo, hi = self.offsets[j], self.offsets[j + 1]
            result = members[lo] if ensembles is None else ensembles[j]
            if dirs[j] is not None:
                mine = (members[lo:hi], mseeds[lo:hi], weights[lo:hi])
                result.checkpoint = checkpoint.write_fold(dirs[j], fold, cfg, result, *mine, *norm)
            results.append(result)
        return results

    def _train(self, fold: Fold, seeds: list[int], log, stop, t_start: float) -> list[FoldResult]:
        """Every member's FoldResult: epochs, selection and the kept weights on val and test."""
        cfgs, K, sync = self.members, len(self.members), self.data.synchronize
        self._begin(fold, seeds)
        sync()
        t_switch = time.perf_counter() - t_start
        if self.use_graph and self.graph is None:
            self._capture()
            self._begin(fold, seeds)  # the capture's warm-up iterations touched weights and replay
        r_max = float(self.data.returns[fold.train[0] : fold.train[1]].abs().max())  # host sync, once a fold
        bounds = [q_bound(c, r_max) for c in cfgs]
        best_score, best_epoch, bad_epochs = [-math.inf] * K, [-1] * K, [0] * K
        status, best_val = ["ok"] * K, [None] * K
        curves: list[list] = [[] for _ in range(K)]
        running = set(range(K))
        train_s, eval_s = [0.0] * K, [0.0] * K
        spe, ups = cfgs[0].steps_per_epoch, cfgs[0].updates_per_step
        tag = (lambda k: f"member {k} ") if K > 1 else (lambda k: "")
        for epoch in range(cfgs[0].epochs):
            if not running:
                break
            t0 = time.perf_counter()
            self.dqn.reset_epoch_stats()
            for _ in range(spe):
                gone = [k for k in running if stop(k)] if stop is not None else []  # host-side flags
                if gone:
                    for k in gone:
                        running.discard(k)
                        status[k] = "cancelled"
                    if not running:
                        break
                    self._mask(running)
                self.graph.replay() if self.graph is not None else self.dqn.step()
            if not running:
                break
            # host sync: (K, 3) mean loss, |Q| max, epsilon
            stats = [(s / (spe * ups), q, e) for s, q, e in self.dqn.epoch_stats().tolist()]
            t1 = time.perf_counter()
            scoring = []
            for k in sorted(running):
                (loss, q_max, eps), bound = stats[k], bounds[k]
                if math.isfinite(loss) and q_max <= bound and loss <= (cfgs[k].huber_delta + cfgs[k].demo) * 2 * bound:
                    scoring.append(k)
                    continue
                status[k] = "diverged"
                running.discard(k)
                curves[k].append(
                    {"epoch": epoch, "loss": loss, "q_max": q_max, "val_sharpe": math.nan, "val_score": math.nan}
                    | {"epoch_s": t1 - t0, "eps": eps}
                )
                if log:
                    log(f"{tag(k)}fold {fold.k} epoch {epoch}: diverged (loss {loss:.3g}, |Q| max {q_max:.3g})")
            vals = self.evaluate(fold.chooser, scoring) if scoring else {}
            t2 = time.perf_counter()
            better = []  # the members whose weights this epoch are their best yet
            for k in scoring:
                (loss, q_max, eps), val = stats[k], vals[k]
                score = selection_score(self.data, val, cfgs[k].cost)
                train_s[k], eval_s[k] = train_s[k] + (t1 - t0), eval_s[k] + (t2 - t1)
                curves[k].append(  # one epoch of the fold's curve (FoldResult.curve)
                    {"epoch": epoch, "loss": loss, "q_max": q_max, "val_sharpe": val.metrics.sharpe, "val_score": score}
                    | {"epoch_s": t2 - t0, "train_s": t1 - t0, "val_s": t2 - t1, "eps": eps}
                )
                if log:
                    log(f"{tag(k)}fold {fold.k} epoch {epoch}: loss {loss:.4f}  val score {score:+.2f}  eps {eps:.2f}")
                if epoch < cfgs[k].select_from:  # scored, never kept; patience counts from select_from
                    continue
                if score > best_score[k] and (cfgs[k].keep == "best" or keeps(val, score)):
                    best_score[k], best_epoch[k], best_val[k], bad_epochs[k] = score, epoch, val, 0
                    better.append(k)
                else:
                    bad_epochs[k] += 1
                    if bad_epochs[k] >= cfgs[k].patience:
                        running.discard(k)
            if better:  # kept: one copy a weight for all of them
                with torch.no_grad():
                    for b, p in zip(self.best_params, self.dqn.params):
                        b[better] = p[better]
            self._mask(running)  # stopped members are masked from here on
        return self._finish(
            fold, curves, status, best_epoch, best_val, best_score, (train_s, eval_s, t_switch, t_start)
        )

    def _mask(self, running: set) -> None:
        """The running members' mask (a device tensor: a captured graph stays valid)."""
        self.dqn.active.copy_(torch.tensor([k in running for k in range(len(self.members))], device=self.data.device))

    def _finish(self, fold, curves, status, best_epoch, best_val, best_score, times) -> list[FoldResult]:
        """Every member's FoldResult: the fold's references, and its kept weights on test (one pass)."""
        train_s, eval_s, t_switch, t_start = times
        t3 = time.perf_counter()
        cfg = self.cfgs[0]
        refs, ref_periods = references(self.data, fold, cfg.cost, cfg.fill, cfg.screen_t)
        results = []
        for k in range(len(self.members)):
            result = FoldResult(fold.as_dict(), status[k], best_epoch[k], len(curves[k]), {}, {}, {}, curves[k])
            if status[k] == "cancelled":
                result.best_epoch, result.timings = -1, {"total_s": time.perf_counter() - t_start}
            else:
                result.baselines, result.baseline_periods = refs, ref_periods
            results.append(result)
        kept = [k for k in range(len(self.members)) if best_val[k] is not None and status[k] == "ok"]
        with torch.no_grad():
            for b, p in zip(self.best_params, self.dqn.params):
                p[kept] = b[kept]
        tests = self.evaluate(fold.test, kept) if kept else {}
        # with a holdout, val was not the chooser: it scores the kept weights now
        vals = self.evaluate(fold.val, kept) if fold.holdout is not None and kept else {}
        for k in kept:
            if k in vals:
                best_val[k], best_score[k] = vals[k], selection_score(self.data, vals[k], self.members[k].cost)
            results[k].scored(best_val[k], tests[k], best_score[k])
        flat = [results[k] for k in range(len(self.members)) if best_val[k] is None and status[k] == "ok"]
        if flat:  # no epoch won on the chooser: the flat policy
            score_flat(self.data, fold, cfg, *flat)
        t4 = time.perf_counter()
        for k, result in enumerate(results):
            if result.status != "cancelled":
                result.timings = {
                    "fold_switch_s": t_switch,
                    "train_s": train_s[k],
                    "eval_s": eval_s[k] + (t4 - t3),
                    "total_s": t4 - t_start,
                }
        return results

    # --- seed ensembles and checkpoints -------------------------------------------------
    def _ensembles(self, fold: Fold, seeds: list[int], members: list[FoldResult], t0: float) -> list[FoldResult]:
        """Per trial, one FoldResult for the mean-Q policy of its "ok" members that kept an epoch
        (slots offsets[j] ...); every trial's mean Q on a window is backtested in one pass."""
        results, slots = [], {}
        for j in range(len(self.cfgs)):
            lo, hi = self.offsets[j], self.offsets[j + 1]
            mine = members[lo:hi]
            spread = {
                "seeds": seeds[lo:hi],
                "status": [m.status for m in mine],
                "val_sharpe": [m.val.get("sharpe") for m in mine],
                "test_sharpe": [m.test.get("sharpe") for m in mine],
            }
            ok = [i for i, m in enumerate(mine) if m.status == "ok"]
            kept = [i for i in ok if not mine[i].abstained]
            first = mine[(kept or ok or [0])[0]]
            results.append(FoldResult(**{**first.as_dict(), "seed_spread": spread, "checkpoint": None}))
            if kept:  # else the fold is what that member's was (flat, or none is "ok")
                results[j].epochs_run = max(m.epochs_run for m in mine)
                slots[j] = [lo + i for i in kept]
        if not slots:
            return results
        cfg = self.cfgs[0]  # cost and fill are shape fields
        chosen = self._mean_backtests(fold.chooser, slots)
        won = {j: s for j, s in slots.items() if cfg.keep == "best" or keeps(chosen[j], self._score(chosen[j]))}
        if won:
            tests = self._mean_backtests(fold.test, won)
            vals = chosen if fold.holdout is None else self._mean_backtests(fold.val, won)
            for j in won:
                results[j].scored(vals[j], tests[j], self._score(vals[j]))
        lost = [results[j] for j in slots if j not in won]  # its members won there, their mean did not: flat
        for result in lost:
            result.best_epoch = -1
        if lost:
            score_flat(self.data, fold, cfg, *lost)
        for j in slots:
            results[j].timings = {**results[j].timings, "total_s": time.perf_counter() - t0}
        return results

    def _score(self, result: BacktestResult) -> float:
        return selection_score(self.data, result, self.cfgs[0].cost)

    def _mean_backtests(self, window: tuple[int, int], slots: dict[int, list[int]]) -> dict[int, BacktestResult]:
        """{trial: the backtest over `window` of the mean Q of its members `slots[trial]`}, in one pass."""
        q, at, means = self.q_all(window, [s for group in slots.values() for s in group]), 0, []
        for group in slots.values():
            means.append(q[at : at + len(group)].mean(0))
            at += len(group)
        costs = [self.cfgs[0].cost] * len(means)
        return dict(zip(slots, backtest_many(torch.stack(means), self.data.window(window, self.cfgs[0].fill), costs)))


def selection_score(data: DeviceData, result: BacktestResult, cost: float) -> float:
    """The selection score of one window (fxray.eval.pooled.score of its hourly returns)."""
    return pooled.score(pooled.pooled([result.periods.as_dict()], cost, data.calendar.periods_per_year))


def window_bars(data: DeviceData, window: tuple[int, int], chunk: int = EVAL_CHUNK) -> list[torch.Tensor]:
    """The bars [start, end - 1) of `window` (those with a next bar) as index tensors on the
    data's device, `chunk` at a time: what every evaluation feeds its Q-network."""
    start, end = window[0], window[1] - 1
    return [torch.arange(s, min(s + chunk, end), device=data.device) for s in range(start, end, chunk)]


# --- a fold the learner abstains on ----------------------------------------------------


def flat_fold(data: DeviceData, fold: Fold, cfgs: list[DQNConfig], t_start: float, checkpoint_dirs=None) -> list:
    """The FoldResult of each config on a fold the learner abstains on (not trained): no epoch
    (best_epoch -1, epochs_run 0, no weights), the flat policy scored on val and test as any
    policy is (its hourly returns, all 0, enter the pooled statistics), the fold's references
    beside it; with a checkpoint dir, the fold's marker there (fxray.rl.checkpoint). The configs
    share cost, fill and screen (a population's shape): the flat policy is backtested once for all."""
    cfg, dirs = cfgs[0], checkpoint_dirs or [None] * len(cfgs)
    results = [FoldResult(fold.as_dict(), "ok", -1, 0, {}, {}, {}) for _ in cfgs]
    refs, ref_periods = references(data, fold, cfg.cost, cfg.fill, cfg.screen_t)
    score_flat(data, fold, cfg, *results)
    for c, d, result in zip(cfgs, dirs, results):
        result.baselines, result.baseline_periods = refs, ref_periods
        result.timings = {"fold_switch_s": 0.0, "train_s": 0.0, "eval_s": 0.0, "total_s": time.perf_counter() - t_start}
        if d is not None:
            checkpoint.write_marker(d, fold, c, result)
    return results


def score_flat(data: DeviceData, fold: Fold, cfg: DQNConfig, *results: FoldResult) -> None:
    """Score each of `results` as the flat policy (all its returns 0) on the fold's val and test
    windows, backtested once: abstained."""
    val, test = (
        evaluate(torch.zeros(w[1] - 1 - w[0], dtype=torch.int8, device=data.device), data.window(w, cfg.fill), cfg.cost)
        for w in (fold.val, fold.test)
    )
    for result in results:
        result.scored(val, test, selection_score(data, val, cfg.cost))
        result.abstained = True
