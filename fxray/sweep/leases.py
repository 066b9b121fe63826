"""A trial's way to the FoldWorkers: leases from one pool, and the stream of its folds.

    trial:   with workers.lease(trial_id) as w:       exactly one trial drives a worker at a time
                 for result in workers.run_folds(w, cfg, folds, seed, ckpt_dir, owner=trial_id):
                     ...                              FoldResult dicts, in fold order

The WorkerPool actor hands idle workers to trials, one owner at a time. A FoldStream
keeps the next fold queued on the leased worker while the trial reports the last one,
so the device does not wait for Tune's round trip (fxray.sweep.trial stops queueing at
ASHA's rungs); closing it cancels what it queued (the running fold ends at its next
step, status "cancelled"). fxray.sweep.workers creates the pool with the workers.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray

if TYPE_CHECKING:
    from fxray.sweep.cluster import WorkerPlan


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class WorkerPool:
    """Hands worker indices to trials: up to `capacity` owners (trial ids) per worker at a time
    (1: exclusive; K > 1: the K trials whose folds the worker trains as populations).

    If it dies (e.g. an OOM kill) it restarts empty: trials holding a lease keep using
    their worker, and for a while more trials than `capacity` may share one (their calls
    queue on the actor: slower, still correct)."""

    def __init__(self, n_workers: int, capacity: int = 1):
        import asyncio

        self.owner: list[list[str]] = [[] for _ in range(n_workers)]
        self.capacity = capacity
        self.changed = asyncio.Condition()

    async def acquire(self, owner: str, prefer: int | None = None) -> int:
        """The index of a worker now leased to `owner`; waits while all are full.
        `prefer` (the worker the owner used last: its Trainer is there) wins if it has room;
        else the least held one."""
        async with self.changed:
            while True:
                held = next((i for i, o in enumerate(self.owner) if owner in o), None)
                if held is not None:  # a retried call from the same trial keeps its worker
                    return held
                room = [i for i, o in enumerate(self.owner) if len(o) < self.capacity]
                if room:
                    i = prefer if prefer in room else min(room, key=lambda j: (len(self.owner[j]), j))
                    self.owner[i].append(owner)
                    return i
                await self.changed.wait()

    async def release(self, owner: str) -> int:
        """Free the worker `owner` holds (idempotent: trials and the driver both call it)."""
        async with self.changed:
            held = sum(map(len, self.owner))
            self.owner = [[x for x in o if x != owner] for o in self.owner]
            self.changed.notify_all()
            return held - sum(map(len, self.owner))


@dataclass
class Workers:
    """What a trial needs to reach the pool: picklable handles (passed by tune.with_parameters)."""

    pool: object  # WorkerPool handle
    handles: list  # FoldWorker handles, index = worker id
    plan: WorkerPlan

    @contextlib.contextmanager
    def lease(self, owner: str, prefer: int | None = None):
        """Hold one worker for the duration of the block; released even on ASHA's stop."""
        index = ray.get(self.pool.acquire.remote(owner, prefer))
        try:
            yield index
        finally:
            self.release(owner)

    def release(self, owner: str) -> None:
        """Return `owner`'s worker to the pool (idempotent; a trial may do it before its block ends)."""
        with contextlib.suppress(Exception):
            ray.get(self.pool.release.remote(owner), timeout=30)

    def run_folds(
        self, index: int, config: dict, folds: list, seed: int, checkpoint_dir=None, owner=None
    ) -> FoldStream:
        """The folds' results in order, the next fold always queued on worker `index`; `owner`
        (the lease's trial id) collects the folds queued when the searcher asked for it."""
        return FoldStream(self.handles[index], config, folds, seed, checkpoint_dir, owner)

    def stats(self, timeout: float = 60) -> list[dict]:
        return ray.get([h.stats.remote() for h in self.handles], timeout=timeout)

    def stop(self) -> None:
        """End the FoldWorkers and their pool (their devices go to the next sweep)."""
        for handle in [*self.handles, self.pool]:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)


class FoldStream:
    """Iterate the results of `folds` in order, while the leased worker is kept two folds
    ahead: the next fold is queued before this one is handed over, so the device does
    not wait for the caller's round trip (a trial's tune.report).

    If the worker died, Ray restarts it and runs the fold again there (the FoldWorker's
    max_task_retries). `close()` (a trial stopped inside tune.report closes it via
    contextlib.closing) cancels what is still queued: the running fold ends at its next
    step, so the worker is free for the next trial."""

    def __init__(self, handle, config: dict, folds: list, seed: int, checkpoint_dir=None, trial_id=None):
        self.handle, self.folds, self.token, self.trial_id = handle, list(folds), uuid.uuid4().hex, trial_id
        self.config, self.seed, self.checkpoint_dir = config, seed, checkpoint_dir
        self.refs = []  # per fold submitted: its ObjectRef
        self.consumed = 0
        self._place()

    def _place(self) -> None:
        """Submit folds until two past the last one handed over are queued."""
        while len(self.refs) < min(len(self.folds), self.consumed + 2):
            fold = self.folds[len(self.refs)]
            args = (self.config, fold, self.seed, self.checkpoint_dir, self.token, self.trial_id)
            self.refs.append(self.handle.train_fold.remote(*args))

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self.consumed >= len(self.folds):
            raise StopIteration
        result = ray.get(self.refs[self.consumed])
        self.consumed += 1
        self._place()
        return result

    def close(self) -> None:
        if len(self.refs) > self.consumed:
            with contextlib.suppress(Exception):
                self.handle.cancel.remote(self.token)
        self.refs = self.refs[: self.consumed]
