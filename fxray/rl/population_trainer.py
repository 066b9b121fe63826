"""Train a population's K members on one walk-forward fold: fxray.rl.trainer.Trainer, K at a time.

    trainer = PopulationTrainer(data, [cfg_a, cfg_b, ...])   # stacked networks; one CUDA graph
    results = trainer.run_fold(fold, seeds=[0, 0, ...])       # one FoldResult per member

Each member's epochs, early stopping, kept weights and test evaluation are Trainer.run_fold's,
with its own settings: member k's FoldResult is the one Trainer(data, cfgs[k]).run_fold(fold,
seeds[k]) returns (bit for bit on the CPU; tests/test_population.py), timings aside. Inside an
epoch all members step together (one graph replay); at the epoch end one read of the (K, 3)
loss accumulators and one batched backtest of every running member's val window. A member
that stops (patience, divergence) is masked: the others go on, it no longer changes. The
loop ends when no member runs. Timings are the population's wall: shared by its members.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict

import torch

from fxray.data.folds import Fold
from fxray.eval import pooled
from fxray.eval.backtest import BacktestResult, backtest_many
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.population import Population
from fxray.rl.trainer import (
    EVAL_CHUNK,
    Q_LIMIT,
    FoldResult,
    epoch_record,
    fold_baselines,
    window_bars,
    write_checkpoint,
)


class CaptureError(RuntimeError):
    """A CUDA graph capture of a population step failed. The trainer is not to be reused (its
    members' generators may be left mid-capture); a fresh one may capture (fxray.sweep.gather)."""


class PopulationTrainer:
    """A Population and its CUDA graph on one device, built once and reused across folds."""

    def __init__(self, data: DeviceData, cfgs: list[DQNConfig]):
        self.data, self.cfgs = data, list(cfgs)
        self.algo = Population(data, self.cfgs)
        self.use_graph = self.cfgs[0].graphs and data.device.type == "cuda"
        self.best_params = [p.detach().clone() for p in self.algo.params]
        self.graph: torch.cuda.CUDAGraph | None = None

    def configure(self, cfgs: list[DQNConfig]) -> None:
        """Other members (of the same shape) in the same K slots, e.g. the next configs of a sweep.
        The captured graph is kept unless the step's structure changed (Population.configure)."""
        if self.algo.configure(cfgs):
            self.graph = None
        self.cfgs = list(cfgs)

    @property
    def K(self) -> int:
        return len(self.cfgs)

    # --- the hot step (Trainer's, with the members' generators registered) --------------
    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.algo.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # each member draws from its own generator: the graph must advance all of them on replay
        if not hasattr(self.graph, "register_generator_state"):
            raise RuntimeError("this torch cannot capture non-default generators in a CUDA graph: set graphs=false")
        for g in self.algo.generators:
            self.graph.register_generator_state(g)
        # In a sweep this runs in the Gatherer's device thread while the worker's other threads
        # wait for their population (fxray.sweep.gather). A garbage collection one of them set off
        # during the capture could free an evicted trainer's graph and memory there (cudaFree: an
        # implicit sync that invalidates the capture and leaves the generators mid-capture). So
        # the collector waits until the capture ends, and the capture checks only its own thread.
        enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.algo.step()
        except Exception as e:  # the graph and the members' generators are unusable now
            self.graph = None
            raise CaptureError(f"CUDA graph capture of a population of {self.K} failed: {e}") from e
        finally:
            if enabled:
                gc.enable()

    def _begin(self, fold: Fold, seeds: list[int]) -> None:
        torch.manual_seed(seeds[0])  # the global generators as Trainer leaves them (members use their own)
        self.data.set_fold(fold)
        self.algo.begin(seeds)

    # --- evaluation --------------------------------------------------------------------
    @torch.no_grad()
    def q_all(self, window: tuple[int, int], members: list[int]) -> torch.Tensor:
        """(M, T, 3, 3) Q-values of `members` for bars [start, end-1) of a window; EVAL_CHUNK
        member-bars per forward (Trainer's activation memory, whatever the population's size)."""
        chunk = max(1, EVAL_CHUNK // len(members))
        return torch.cat(
            [self.algo.q_all(self.data.states(t), members) for t in window_bars(self.data, window, chunk)], 1
        )

    def evaluate(self, window: tuple[int, int], members: list[int]) -> dict[int, BacktestResult]:
        """The greedy backtest of `members` over `window`, in one pass."""
        costs = [self.cfgs[k].cost for k in members]
        results = backtest_many(self.q_all(window, members), self.data.window(window, self.cfgs[0].fill), costs)
        return dict(zip(members, results))

    def score(self, k: int, result: BacktestResult) -> float:
        cfg = self.cfgs[k]
        return pooled.score(pooled.pooled([result.periods.as_dict()], cfg.cost, self.data.calendar.periods_per_year))

    # --- one fold, every member ------------------------------------------------------------
    def run_fold(
        self, fold: Fold, seeds: list[int] | None = None, log=None, checkpoint_dirs=None, stop=None
    ) -> list[FoldResult]:
        """Trainer.run_fold of each member (seeds[k], checkpoint_dirs[k]). `stop(k)`, asked before
        every step for each running member, ends member k's fold at once with status "cancelled"
        (masked: the others go on); when no member runs, the fold ends."""
        cfgs, K, sync = self.cfgs, self.K, self.data.synchronize
        seeds = [0] * K if seeds is None else list(seeds)
        if len(seeds) != K:
            raise ValueError(f"{K} members but {len(seeds)} seeds")
        torch.backends.cuda.matmul.allow_tf32 = cfgs[0].matmul == "tf32"
        t_start = time.perf_counter()
        self._begin(fold, seeds)
        sync()
        t_switch = time.perf_counter() - t_start
        if self.use_graph and self.graph is None:
            self._capture()
            self._begin(fold, seeds)
        best_score, best_epoch, bad_epochs = [-math.inf] * K, [-1] * K, [0] * K
        status, best_val = ["ok"] * K, [None] * K
        curves: list[list] = [[] for _ in range(K)]
        running = set(range(K))
        train_s, eval_s = [0.0] * K, [0.0] * K
        spe, ups = cfgs[0].steps_per_epoch, cfgs[0].updates_per_step
        for epoch in range(cfgs[0].epochs):
            if not running:
                break
            t0 = time.perf_counter()
            self.algo.reset_epoch_stats()
            for _ in range(spe):
                gone = [k for k in running if stop(k)] if stop is not None else []  # host-side flags
                if gone:
                    for k in gone:
                        running.discard(k)
                        status[k] = "cancelled"
                    if not running:
                        break
                    self.algo.active.copy_(torch.tensor([k in running for k in range(K)], device=self.data.device))
                self.graph.replay() if self.graph is not None else self.algo.step()
            if not running:
                break
            stats = self.algo.epoch_stats().tolist()  # host sync: (K, 3) loss sums, |Q| max, epsilon
            t1 = time.perf_counter()
            scoring = []
            for k in sorted(running):
                loss_sum, q_max, eps = stats[k]
                loss = loss_sum / (spe * ups)
                if math.isfinite(loss) and math.isfinite(q_max) and q_max < Q_LIMIT:
                    scoring.append(k)
                    continue
                status[k] = "diverged"
                running.discard(k)
                curves[k].append(
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
                    log(f"member {k} fold {fold.k} epoch {epoch}: diverged (loss {loss:.3g}, |Q| max {q_max:.3g})")
            vals = self.evaluate(fold.chooser, scoring) if scoring else {}
            t2 = time.perf_counter()
            for k in scoring:
                loss_sum, q_max, eps = stats[k]
                loss, val = loss_sum / (spe * ups), vals[k]
                score = self.score(k, val)
                train_s[k], eval_s[k] = train_s[k] + (t1 - t0), eval_s[k] + (t2 - t1)
                curves[k].append(epoch_record(epoch, loss, q_max, val, score, eps, (t0, t1, t2)))
                if log:
                    log(
                        f"member {k} fold {fold.k} epoch {epoch}: loss {loss:.4f}  val score {score:+.2f}  "
                        f"eps {eps:.2f}"
                    )
                if epoch < cfgs[k].select_from:  # scored, never kept (TrainConfig.select_from)
                    continue
                if cfgs[k].select == "last" or score > best_score[k]:
                    best_score[k], best_epoch[k], best_val[k], bad_epochs[k] = score, epoch, val, 0
                    for b, p in zip(self.best_params, self.algo.params):
                        b[k].copy_(p[k])
                else:
                    bad_epochs[k] += 1
                    if bad_epochs[k] >= cfgs[k].patience:
                        running.discard(k)
            # stopped members are masked from here on (a device tensor: the graph stays valid)
            self.algo.active.copy_(torch.tensor([k in running for k in range(K)], device=self.data.device))
        return self._finish(
            fold, curves, status, best_epoch, best_val, best_score, train_s, eval_s, t_switch, t_start, checkpoint_dirs
        )

    def _finish(
        self,
        fold,
        curves,
        status,
        best_epoch,
        best_val,
        best_score,
        train_s,
        eval_s,
        t_switch,
        t_start,
        checkpoint_dirs,
    ):
        """Every member's FoldResult: its baselines, and its kept weights on the test window (one pass)."""
        t3 = time.perf_counter()
        results, adx = [], self.data.adx_mean(fold.train)
        for k, cfg in enumerate(self.cfgs):
            if status[k] == "cancelled":
                results.append(self._cancelled(fold, curves[k], t_start))
                continue
            result = FoldResult(
                fold=fold.as_dict(),
                status=status[k],
                best_epoch=best_epoch[k],
                epochs_run=len(curves[k]),
                val={},
                test={},
                baselines={},
                curve=curves[k],
                adx=adx,
            )
            result.baselines, result.baseline_periods = fold_baselines(
                self.data, fold, cfg.cost, cfg.fill, cfg.screen_t
            )
            results.append(result)
        kept = [k for k in range(self.K) if best_val[k] is not None and status[k] == "ok"]
        with torch.no_grad():
            for b, p in zip(self.best_params, self.algo.params):
                p[kept] = b[kept]
        tests = self.evaluate(fold.test, kept) if kept else {}
        if fold.holdout is not None and kept:  # val was not the chooser: it scores the kept weights now
            vals = self.evaluate(fold.val, kept)
            for k in kept:
                best_val[k], best_score[k] = vals[k], self.score(k, vals[k])
        for k in kept:
            result, test = results[k], tests[k]
            result.val, result.test = asdict(best_val[k].metrics), asdict(test.metrics)
            result.val_periods, result.test_periods = best_val[k].periods.as_dict(), test.periods.as_dict()
            result.val_score = best_score[k]
            result.test_daily_returns = test.daily_returns.tolist()
            if checkpoint_dirs is not None and checkpoint_dirs[k] is not None:
                state = self.algo.state_dict(k)
                result.checkpoint = str(
                    write_checkpoint(checkpoint_dirs[k], self.cfgs[k], self.data, state, fold, result)
                )
        t4 = time.perf_counter()
        for k, result in enumerate(results):
            if result.status == "cancelled":
                continue
            result.timings = {
                "fold_switch_s": t_switch,
                "train_s": train_s[k],
                "eval_s": eval_s[k] + (t4 - t3),
                "total_s": t4 - t_start,
            }
        return results

    def _cancelled(self, fold: Fold, curve: list, t_start: float) -> FoldResult:
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
