"""A FoldWorker's fold requests, trained K trials at a time: every fold of a sweep goes through here.

    gatherer = Gatherer(data, k_max=4)
    result = gatherer.train(config, fold, seed, checkpoint_dir, stop)   # from any thread; blocks
    req = gatherer.submit(config, fold, seed, ...); result = gatherer.wait(req)  # the same, in two
    done = gatherer.prepare(config, folds)    # the folds' shared work, while no request waits

With `sweep.population: K`, up to K trials hold a lease on one worker at once, and each
queues its next folds there (fxray.sweep.leases); K = 1 trains one trial at a time. The
worker's calls run in threads; each puts its request here and waits. One thread of the
Gatherer's own does all the device work (building, capturing, training and dropping
trainers), so a CUDA graph is captured, replayed and destroyed by one thread, and the
trainer is fxray.rl.trainer's, the one way a fold is trained. It trains the next population:
the oldest waiting request and the others of the same shape (fxray.rl.dqn.SHAPE_FIELDS,
their seeds included) and the same fold, at most K of them, after waiting at most WAIT_S for
the K-th; each trial's seeds are members beside the others'. Each request gets back the
FoldResult dict its config would have got alone (bit for bit on the CPU:
tests/test_learner.py), plus "population": the number of trials it trained with. A request
whose `stop()` turns true is masked in its population (status "cancelled"); the others go
on. No Ray here: tests drive it with threads.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from fxray.data.folds import Fold
from fxray.rl.config import make_config
from fxray.rl.device import DTYPES
from fxray.rl.dqn import SHAPE_FIELDS
from fxray.rl.references import prepare
from fxray.rl.trainer import CaptureError, Trainer

WAIT_S = 0.05  # longest wait for a population to fill (a GPU fold takes 0.4-0.7 s)
GATE_S = 60.0  # longest wait for the first population's trials (`expect`), from the first one's request
QUIET_S = 3.0  # ... or from the last new trial's: none came since (a resumed round may have fewer left)
TRAINER_CACHE = 2  # Trainers (stacked networks + graph) kept, by shape and size


@dataclass(eq=False)  # by identity: two trials may send equal requests, and each is trained
class Request:
    fold: dict
    seed: int
    checkpoint_dir: str | None
    stop: object  # () -> bool, or None
    warmup: bool = False  # a worker's warm-up fold (logged apart: fxray.sweep.workers)
    owner: object = None  # the stream of folds it came from (a trial's): the gate counts them
    key: tuple = ()  # (shape, fold): requests with the same key can share a population
    cfg: object = None
    result: dict | None = None
    error: BaseException | None = None
    done: bool = False


class Gatherer:
    """The queue of one worker's fold requests and the populations trained from it."""

    def __init__(
        self,
        data,
        k_max: int,
        wait_s: float = WAIT_S,
        pad: bool | None = None,
        expect: int = 1,
        gate_s: float = GATE_S,
        quiet_s: float = QUIET_S,
    ):
        """`pad` (default: on CUDA): a population of n requests takes the slots of the next power of
        two (at most k_max), the spare slots masked from the first step. Their compute is wasted
        (< 2x), but only log2(k_max) + 1 sizes exist, so the worker keeps one captured graph per
        size instead of capturing again whenever the size changes (seconds each on a GPU).
        `expect`: the trials this worker trains at once when all have come (Tune starts their
        processes over seconds): its first population waits until as many streams of folds have
        a request queued (at most `gate_s`, or `quiet_s` after the last new one came), so that it
        is not trained by the first trial alone and then again by each later group (a population
        of one costs a GPU nearly a full one's time); fold work ahead (`prepare`) goes on
        meanwhile. From then on the trials move together."""
        self.data, self.k_max, self.wait_s = data, k_max, wait_s
        self.expect, self.gate_s, self.quiet_s = expect, gate_s, quiet_s
        self.gate_at = self.quiet_at = None  # the gate's deadlines (None: no request yet)
        self.pad = data.device.type == "cuda" if pad is None else pad
        self.cache = k_max.bit_length() + 1 if self.pad else TRAINER_CACHE
        self.cond = threading.Condition()
        self.queue: list[Request] = []
        self.trainers: OrderedDict = OrderedDict()  # touched by the device thread only
        self.sizes: list[int] = []  # the size of every population trained, for the sweep report
        # per population: [start, end (unix s), size, "warmup" | "training" | "cancelled"]; a
        # request's own call spans its wait in the queue too, so the report counts these
        self.runs: list[list] = []
        self.capture_retries = 0  # populations trained again on a fresh trainer after a failed capture
        self.built = 0  # trainers built (each one's networks, replay and graph)
        self.ahead: list = []  # [config, fold, done event]: fold work to do while no request waits (prepare)
        self.preparing = False  # the device thread is preparing a fold now
        threading.Thread(target=self._loop, name="fxray-population", daemon=True).start()  # the device thread

    def train(self, *args, **kwargs) -> dict:
        """`submit` (the same arguments), then `wait`."""
        return self.wait(self.submit(*args, **kwargs))

    def submit(
        self, config: dict, fold: dict, seed: int, checkpoint_dir=None, stop=None, warmup=False, owner=None
    ) -> Request:
        """Queue a request without waiting for it (`wait` gets its result)."""
        cfg = make_config(config)
        if DTYPES[cfg.dtype] != self.data.dtype:
            raise ValueError(
                f"dqn.dtype {cfg.dtype!r} differs from the worker's data ({self.data.dtype}); "
                "the storage dtype is fixed per sweep"
            )
        # the fields a population's members share (fxray.rl.dqn.SHAPE_FIELDS), as a key
        shape = json.dumps({k: getattr(cfg, k) for k in SHAPE_FIELDS}, sort_keys=True)
        key = (shape, json.dumps(fold, sort_keys=True), warmup)
        req = Request(fold, seed, checkpoint_dir, stop, warmup, owner, key, cfg)
        with self.cond:
            if not warmup and self.expect > 1:
                now = time.time()
                self.gate_at = self.gate_at or now + self.gate_s
                if all(r.owner != owner for r in self.queue):
                    self.quiet_at = now + self.quiet_s
            self.queue.append(req)
            self.cond.notify_all()
        return req

    def wait(self, req: Request) -> dict:
        with self.cond:
            self.cond.wait_for(lambda: req.done)
        if req.error is not None:
            raise req.error
        return req.result

    def prepare(self, config: dict, folds: list[dict]) -> threading.Event:
        """Queue each fold's work that no trial's hyperparameters change (fxray.rl.references.prepare,
        for `config`'s cost, fill and screen): the device thread does it fold by fold whenever no
        request waits, so that Tune's start-up hides it and a fold's first population finds it
        done. The event is set when every fold is prepared (never, if `settle` drops some first)."""
        done, cfg = threading.Event(), make_config(config)
        jobs = [[cfg, Fold.from_dict(f), None] for f in folds]
        if not jobs:
            done.set()
            return done
        jobs[-1][2] = done
        with self.cond:
            self.ahead += jobs
            self.cond.notify_all()
        return done

    def settle(self) -> None:
        """Drop the folds not prepared yet and wait for the one being prepared: afterwards the device
        thread touches the data only for requests (a FoldWorker's vote sets folds on it itself)."""
        with self.cond:
            self.ahead.clear()
            self.cond.wait_for(lambda: not self.preparing)

    def _loop(self) -> None:
        """The device thread: train the next population, forever.
        On CUDA all of it runs on a stream of its own: nothing fxray does is queued on the legacy
        default stream, which a capture elsewhere in the process must not see used."""
        if self.data.device.type != "cuda":
            return self._serve()
        import torch

        stream = torch.cuda.Stream(self.data.device)
        stream.wait_stream(torch.cuda.current_stream(self.data.device))  # the market's upload
        with torch.cuda.stream(stream):
            self._serve()

    def _due(self) -> bool:
        """(The lock held.) The queue may be served now: a warm-up waits, or the gate is open."""
        if any(r.warmup for r in self.queue):
            return True
        if self.expect > 1 and self.queue:
            if len({r.owner for r in self.queue}) < self.expect and time.time() < min(self.gate_at, self.quiet_at):
                return False
            self.expect = 1  # open for good
        return bool(self.queue)

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not (self._due() or self.ahead):
                    self.cond.wait(timeout=0.5 if self.queue else None)  # the gate's deadline
                batch, job = (self._take(), None) if self._due() else ([], self.ahead.pop(0))
                self.preparing = job is not None
            if batch:
                self._run(batch)
                continue
            self._prepare(*job)
            with self.cond:
                self.preparing = False
                self.cond.notify_all()

    def _prepare(self, cfg, fold: Fold, done) -> None:
        """One fold's prepared work, logged as start-up (a "warmup" run); an error is left for the
        fold's training to meet again, where it reaches a trial."""
        t0 = time.time()
        with contextlib.suppress(Exception):  # the fold's own training computes it again and reports
            prepare(self.data, fold, cfg)
        self.runs.append([t0, time.time(), 0, "warmup"])
        if done is not None:
            done.set()

    def _take(self) -> list[Request]:
        """The oldest request (a warm-up first) and up to k_max - 1 more of its key (the lock held;
        waits for them)."""
        key = next((r for r in self.queue if r.warmup), self.queue[0]).key
        self.cond.wait_for(lambda: sum(r.key == key for r in self.queue) >= self.k_max, self.wait_s)
        batch = [r for r in self.queue if r.key == key][: self.k_max]
        self.queue = [r for r in self.queue if r not in batch]
        return batch

    def _run(self, batch: list[Request]) -> None:
        """Train `batch` as one population; every request gets its result (or the error). A failed
        CUDA graph capture (rare, but seen under a sweep on an H200) drops the trainer and trains
        the batch once more on a fresh one, which captures again; a second failure is handed to
        the callers. A warm-up's trainer is dropped at once: it is never used again."""
        t0, n, first = time.time(), len(batch), batch[0]
        try:
            try:
                results = self._train(batch)
            except CaptureError:
                self._drop(first.key[0])
                self.capture_retries += 1
                results = self._train(batch)
            self.sizes.append(n)
            kind = "warmup" if first.warmup else "training"
            if all(r.status == "cancelled" for r in results):
                kind = "cancelled"
            self.runs.append([t0, time.time(), n, kind])
            for r, result in zip(batch, results):
                r.result = {**result.as_dict(), "population": n}
            if first.warmup:
                self._drop(first.key[0])
        except BaseException as e:  # noqa: BLE001 - handed to every caller of the batch
            self._drop(first.key[0])  # a trainer that failed mid-fold is not reused
            for r in batch:
                r.error = e
        finally:
            with self.cond:
                for r in batch:
                    r.done = True
                self.cond.notify_all()

    def _drop(self, shape: str) -> None:
        self.trainers = OrderedDict((k, t) for k, t in self.trainers.items() if k[0] != shape)

    def _train(self, batch: list[Request]) -> list:
        """The FoldResults of `batch` (trials of one shape, on one fold), trained together on the
        cached trainer of their shape and size; spare slots (`pad`) are stopped before the first step."""
        n, first = len(batch), batch[0]
        slots = min(self.k_max, 1 << (n - 1).bit_length()) if self.pad else n
        cfgs = [r.cfg for r in batch] + [first.cfg] * (slots - n)
        return self._trainer((first.key[0], slots), cfgs).run_fold(
            Fold.from_dict(first.fold),
            [r.seed for r in batch] + [first.seed] * (slots - n),
            checkpoint_dirs=[r.checkpoint_dir for r in batch] + [None] * (slots - n),
            stop=lambda j: j >= n or (batch[j].stop is not None and batch[j].stop()),
        )[:n]

    def _trainer(self, key: tuple, cfgs) -> Trainer:
        """The cached trainer of `key` given `cfgs` in place (configure), or a new one; the least
        recently used beyond the cache is dropped."""
        trainer = self.trainers.pop(key, None)
        if trainer is None:
            trainer = Trainer(self.data, cfgs)
            self.built += 1
        else:
            trainer.configure(cfgs)
        self.trainers[key] = trainer
        while len(self.trainers) > self.cache:
            self.trainers.popitem(last=False)
        return trainer
