"""A FoldWorker's fold requests, trained K trials at a time: every fold of a sweep goes through here.

    gatherer = Gatherer(data, k_max=4)
    result = gatherer.train(config, fold, seed, checkpoint_dir, stop)   # from any thread; blocks
    req = gatherer.submit(config, fold, seed, ...); result = gatherer.wait(req)  # the same, in two

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

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from fxray.data.folds import Fold
from fxray.rl.config import make_config
from fxray.rl.device import DTYPES
from fxray.rl.dqn import SHAPE_FIELDS
from fxray.rl.trainer import CaptureError, Trainer

WAIT_S = 0.05  # longest wait for a population to fill (a GPU fold takes 0.4-0.7 s)
TRAINER_CACHE = 2  # Trainers (stacked networks + graph) kept, by shape and size
PAD = 8  # on CUDA a population's slots: a power of two up to this, a multiple of it above


@dataclass(eq=False)  # by identity: two trials may send equal requests, and each is trained
class Request:
    fold: dict
    seed: int
    checkpoint_dir: str | None
    stop: object  # () -> bool, or None
    warmup: bool = False  # a worker's warm-up fold (logged apart: fxray.sweep.workers)
    key: tuple = ()  # (shape, fold): requests with the same key can share a population
    cfg: object = None
    result: dict | None = None
    error: BaseException | None = None
    done: bool = False


class Gatherer:
    """The queue of one worker's fold requests and the populations trained from it."""

    def __init__(self, data, k_max: int, wait_s: float = WAIT_S, pad: bool | None = None):
        """`pad` (default: on CUDA): a population of n requests takes the slots of the next power of
        two up to PAD, of the next multiple of PAD above it (at most k_max), the spare slots masked
        from the first step. Their compute is wasted (< PAD members), but few sizes exist, so the
        worker keeps one captured graph per size instead of capturing again whenever the size
        changes (seconds each on a GPU)."""
        self.data, self.k_max, self.wait_s = data, k_max, wait_s
        self.pad = data.device.type == "cuda" if pad is None else pad
        self.cache = PAD.bit_length() + k_max // PAD if self.pad else TRAINER_CACHE
        self.cond = threading.Condition()
        self.queue: list[Request] = []
        self.trainers: OrderedDict = OrderedDict()  # touched by the device thread only
        self.sizes: list[int] = []  # the size of every population trained, for the sweep report
        # per population: [start, end (unix s), size, "warmup" | "training" | "cancelled"]; a
        # request's own call spans its wait in the queue too, so the report counts these
        self.runs: list[list] = []
        self.capture_retries = 0  # populations trained again on a fresh trainer after a failed capture
        self.built = 0  # trainers built (each one's networks, replay and graph)
        threading.Thread(target=self._loop, name="fxray-population", daemon=True).start()  # the device thread

    def train(self, *args, **kwargs) -> dict:
        """`submit` (the same arguments), then `wait`."""
        return self.wait(self.submit(*args, **kwargs))

    def submit(self, config: dict, fold: dict, seed: int, checkpoint_dir=None, stop=None, warmup=False) -> Request:
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
        req = Request(fold, seed, checkpoint_dir, stop, warmup, key, cfg)
        with self.cond:
            self.queue.append(req)
            self.cond.notify_all()
        return req

    def wait(self, req: Request) -> dict:
        with self.cond:
            self.cond.wait_for(lambda: req.done)
        if req.error is not None:
            raise req.error
        return req.result

    def due(self) -> dict:
        """{queued request: the population that will train it, 1 the next one, 2 the one after, ...}:
        `_take`'s order over the queue as it stands (the oldest request's shape and fold first)."""
        with self.cond:
            queue, due, n = list(self.queue), {}, 0
        while queue:
            n += 1
            due.update(dict.fromkeys(self._batch(queue, queue[0].key), n))
            queue = [r for r in queue if r not in due]
        return due

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

    def _serve(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue)
                batch = self._take()
            self._run(batch)

    def _take(self) -> list[Request]:
        """The oldest request (a warm-up first) and up to k_max - 1 more of its key (the lock held;
        waits for them)."""
        key = next((r for r in self.queue if r.warmup), self.queue[0]).key
        self.cond.wait_for(lambda: sum(r.key == key for r in self.queue) >= self.k_max, self.wait_s)
        batch = self._batch(self.queue, key)
        self.queue = [r for r in self.queue if r not in batch]
        return batch

    def _batch(self, queue: list[Request], key: tuple) -> list[Request]:
        """The population `key`'s requests in `queue` make: the oldest k_max of them."""
        return [r for r in queue if r.key == key][: self.k_max]

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
        slots = min(self.k_max, 1 << (n - 1).bit_length() if n <= PAD else -(-n // PAD) * PAD) if self.pad else n
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
