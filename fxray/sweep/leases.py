"""A trial's way to the FoldWorkers: leases from one pool, and the stream of its folds.

    trial:   with workers.lease(trial_id) as w:       exactly one trial drives a worker at a time
                 for result in workers.run_folds(w, cfg, folds, seed, ckpt_dir, owner=trial_id):
                     ...                              FoldResult dicts, in fold order

The WorkerPool actor hands idle workers to trials, one owner at a time, and lends
an idle worker no trial is waiting for. A FoldStream keeps the next fold queued on
the leased worker while the trial reports the last one, so the device does not wait
for Tune's round trip (fxray.sweep.trial stops queueing at ASHA's rungs), and spreads
later folds over borrowed workers when there are more workers than trials (the end
of a sweep); closing it cancels what it queued (the running fold ends at its next
step, status "cancelled"). fxray.sweep.workers creates the pool with the workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray
from ray.exceptions import RayActorError

if TYPE_CHECKING:
    from fxray.sweep.cluster import WorkerPlan

FOLD_RETRIES = 3  # fold calls lost to a dead worker before the trial gives up


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
        self.waiting = 0  # acquire() calls waiting for a worker

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
                self.waiting += 1
                try:
                    await self.changed.wait()
                finally:
                    self.waiting -= 1

    async def try_acquire(self, owner: str) -> int | None:
        """An idle worker (no owner at all) leased to `owner` at once, or None: none is idle, or
        a trial waits for one (it comes first). How a trial borrows a worker for more of its folds."""
        async with self.changed:
            idle = [i for i, o in enumerate(self.owner) if not o]
            if self.waiting or not idle:
                return None
            self.owner[idle[0]].append(owner)
            return idle[0]

    async def release(self, owner: str) -> int:
        """Free every worker `owner` holds, the ones it borrowed (owner "OWNER+x") too
        (idempotent: trials and the driver both call it)."""
        async with self.changed:
            held = sum(map(len, self.owner))
            self.owner = [[x for x in o if x != owner and not x.startswith(owner + "+")] for o in self.owner]
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
        """The folds' results in order, the next fold always queued on the worker; with
        `owner` (the lease's), idle workers are borrowed for later folds (see FoldStream)."""
        borrow = (lambda: self.borrow(owner)) if owner and len(self.handles) > 1 else None
        return FoldStream(self.handles[index], config, folds, seed, checkpoint_dir, borrow, owner)

    def borrow(self, owner: str):
        """(handle, give-back function) of a worker idle with no trial waiting, or None."""
        name = f"{owner}+{uuid.uuid4().hex[:8]}"
        index = ray.get(self.pool.try_acquire.remote(name))
        return None if index is None else (self.handles[index], lambda: self.release(name))

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

    Folds are independent (each starts from its own seeded init), so when every worker
    the stream holds has two folds queued, `borrow` may lend it another worker: one idle
    with no trial waiting for it, which happens when fewer trials are left than workers
    (the end of a sweep). Later folds go to whichever held worker has the fewest queued;
    a borrowed worker goes back to the pool as soon as its folds are done. Results
    still come in fold order.

    If a worker died, Ray restarts it and the fold is submitted again (on the leased
    worker). `close()` (a trial stopped inside tune.report closes it via
    contextlib.closing) cancels what is still queued, on every worker it used: the
    running fold ends at its next step, so the worker is free for the next trial."""

    def __init__(self, handle, config: dict, folds: list, seed: int, checkpoint_dir=None, borrow=None, trial_id=None):
        self.folds, self.token, self.borrow, self.trial_id = list(folds), uuid.uuid4().hex, borrow, trial_id
        self.config, self.seed, self.checkpoint_dir = config, seed, checkpoint_dir
        self.handles = [handle]  # slot 0: the leased worker; then the borrowed ones
        self.give_back = {}  # slot -> function returning a borrowed worker still held
        self.placed = []  # per fold submitted: (slot, ObjectRef)
        self.done = set()  # refs known to have finished
        self.consumed = 0
        self._place()

    def _submit(self, slot: int, fold: dict):
        handle = self.handles[slot]
        return handle.train_fold.remote(self.config, fold, self.seed, self.checkpoint_dir, self.token, self.trial_id)

    def _place(self) -> None:
        """Submit folds while a held worker has fewer than two unfinished; borrow when none has."""
        while len(self.placed) < len(self.folds):
            load = Counter(slot for slot, ref in self.placed[self.consumed :] if ref not in self.done)
            slot = min([0, *self.give_back], key=lambda k: (load[k], k))
            if load[slot] >= 2:
                lent = self.borrow() if self.borrow else None
                if lent is None:
                    return
                slot = len(self.handles)
                self.handles.append(lent[0])
                self.give_back[slot] = lent[1]
            self.placed.append((slot, self._submit(slot, self.folds[len(self.placed)])))

    def _wait_for(self, i: int) -> None:
        """Until fold i is done; borrowed workers that finish meanwhile go back, and the
        freed places take more folds."""
        while True:
            self._place()
            if self.placed[i][1] in self.done:
                return
            pending = [r for _, r in self.placed[i:] if r not in self.done]
            ready, _ = ray.wait(pending, num_returns=1)
            self.done.update(ready)
            busy = {slot for slot, r in self.placed[i:] if r not in self.done}
            for slot in [k for k in self.give_back if k not in busy]:
                self.give_back.pop(slot)()

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        i = self.consumed
        if i >= len(self.folds):
            raise StopIteration
        for attempt in range(FOLD_RETRIES + 1):
            self._wait_for(i)
            try:
                result = ray.get(self.placed[i][1])
                break
            except RayActorError:
                if attempt == FOLD_RETRIES:
                    raise
                time.sleep(1.0 + attempt)  # give Ray time to restart the actor
                self.placed[i] = (0, self._submit(0, self.folds[i]))
        self.consumed = i + 1
        self._place()
        return result

    def close(self) -> None:
        for slot in {slot for slot, _ in self.placed[self.consumed :]}:
            with contextlib.suppress(Exception):
                self.handles[slot].cancel.remote(self.token)
        self.placed = self.placed[: self.consumed]
        for give_back in self.give_back.values():
            give_back()
        self.give_back.clear()


def pool_name(storage) -> str:
    """The WorkerPool's actor name: one per run directory, found again by the callbacks."""
    return "fxray-pool-" + hashlib.sha1(str(storage).encode()).hexdigest()[:10]
