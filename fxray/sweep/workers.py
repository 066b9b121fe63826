"""Ray side of the data flow: the dataset in the object store once, one FoldWorker per GPU.

    driver:  ref = put_market(market)                 once per sweep (copied once per node)
             workers = start_workers(ref, plan, ...)  BEFORE Tuner.fit(): an actor created inside
                                                      a trial would join its placement group
    trial:   with workers.lease(trial_id) as w:       exactly one trial drives a worker at a time
                 for result in workers.run_folds(w, cfg, folds, seed, ckpt_dir):  -> FoldResult dicts

A FoldWorker `ray.get`s the arrays once (zero-copy, read-only) and uploads them
into one DeviceData for its whole life; its folds are trained through its Gatherer
(fxray.sweep.gather), which keeps a Trainer per shape, so the folds of a trial (and the
trials after it) reuse networks, replay and the captured CUDA graph. Trials reach
the workers through fxray.sweep.leases (the pool of leases, and the stream of a trial's
folds on them); they never import torch nor touch CUDA (a 0-GPU Ray process can see
every GPU). A worker that dies is restarted by Ray and reloads from the object
store; Ray runs its queued folds again there (ACTOR_OPTIONS' max_task_retries).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
import warnings

import ray

from fxray.data.arrays import host_arrays
from fxray.data.cache import first_line
from fxray.sweep.cluster import WorkerPlan, check_object_store
from fxray.sweep.leases import WorkerPool, Workers
from fxray.sweep.logs import quiet_exit


def put_market(market) -> ray.ObjectRef:
    """The arrays of `fxray.data.arrays.host_arrays(market)` into the object store, once."""
    arrays = host_arrays(market)
    check_object_store(arrays, market.path)  # every node's store must hold a copy: fail now, not hang
    return ray.put(arrays)


# --- the actor -----------------------------------------------------------------------

CLAIMED = "claimed"  # an asked fold its trial's own call trains (see DeviceWorker.asked)
ACTOR_OPTIONS = dict(max_restarts=-1, max_task_retries=2, concurrency_groups={"control": 1})


class DeviceWorker:
    """One device-resident copy of the dataset and the Trainers that use it.

    `train_fold` runs in the default group (one at a time, in submission order);
    `cancel` and `stats` run in their own thread, so they answer while a fold trains.
    """

    def __init__(self, arrays_ref: list, index: int, torch_threads=1, dtype="float32", population=1):
        t_init = time.time()  # the process is up and Ray has loaded this class
        quiet_exit()  # its end, when Ray ends the process, says nothing (fxray.sweep.logs)
        import torch

        from fxray.rl.device import DeviceData

        t_imported = time.time()
        torch.set_num_threads(torch_threads)
        # Inside an actor with num_gpus > 0, Ray sets CUDA_VISIBLE_DEVICES: cuda:0 is ours.
        # Decided by the hardware, not by Ray's (possibly logical) GPU ids.
        self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
        # from zero-copy read-only views into the object store, which pin nothing afterwards
        self.data = DeviceData(ray.get(arrays_ref[0]), device=self.device, dtype=dtype)
        self.index, self.n_loads, self.n_calls = index, 1, 0
        # unix times of the start-up steps, for scripts/sweep_report.py
        self.timeline = {"init": t_init, "imported": t_imported, "loaded": time.time()}
        self.load_s = self.timeline["loaded"] - t_imported
        with warnings.catch_warnings(action="ignore"):  # the property warns about an API it uses internally
            self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        from fxray.sweep.gather import Gatherer

        # every fold this worker trains: up to `population` trials at once (1: one at a time)
        self.gatherer = Gatherer(self.data, population)
        self.cancelled: set = set()  # tokens whose queued folds are no longer wanted
        # (trial id, fold k) -> its Request, queued when the searcher asked the trial; CLAIMED: the
        # trial's own call came first (Ray orders no calls across callers), so none is queued
        self.asked: dict = {}
        self.asked_lock = threading.Lock()
        self.n_asked = self.n_asked_collected = 0  # folds the searcher asked for; those queued and collected
        self.calls: list = []  # per call: [start, end (unix s), token, fold k, status]
        self.running: list | None = None  # [start, token, fold k] of the fold training now
        self.warmup_error: str | None = None

    def train_fold(self, config: dict, fold: dict, seed: int, checkpoint_dir=None, token=None, trial_id=None) -> dict:
        """Train `config` on `fold`. A fold whose `token` was cancelled returns status
        "cancelled" (at once if not started, else at its next step). A fold `queue_asked` queued
        for `trial_id` is that request's result (the same config, fold, seed and checkpoint)."""
        t0 = time.time()
        self.n_calls += 1
        asked = None
        if trial_id is not None:
            with self.asked_lock:
                asked = self.asked.pop((trial_id, fold["k"]), CLAIMED)
                if asked is CLAIMED:  # none queued (or its trial asks again: a retried trial process)
                    asked, self.asked[(trial_id, fold["k"])] = None, CLAIMED
        if asked is not None:
            result = self.gatherer.wait(asked)
            self.n_asked_collected += 1
        elif token in self.cancelled:
            result = {"status": "cancelled", "fold": fold, "epochs_run": 0, "timings": {"total_s": 0.0}}
        else:
            self.running = [t0, token, fold["k"]]
            try:
                stop = self.cancelled.__contains__
                result = self.gatherer.train(config, fold, seed, checkpoint_dir, lambda: stop(token))
            finally:
                self.running = None
        result["worker"] = self.index
        self.calls.append([t0, time.time(), token, fold["k"], result["status"]])
        return result

    @ray.method(concurrency_group="control")
    def queue_asked(self, trials: list[tuple[str, dict, str]], folds: list[dict], seed: int) -> None:
        """Queue the folds of trials (trial id, config, checkpoint dir) as the searcher asks them
        (fxray.sweep.search), before Tune has started their processes: the populations train
        while no trial process waits, and each trial's train_fold then collects its fold. One call
        for a batch: the first population is all of the batch's trials of its shape, not those whose
        call came first. A fold its config cannot train is left for the trial's own call, which
        reports why."""
        with self.gatherer.cond:  # (the Gatherer's lock: it takes the next population after, not during)
            for trial_id, config, checkpoint_dir in trials:
                for fold in folds:
                    with self.asked_lock, contextlib.suppress(Exception):
                        self.n_asked += 1
                        if self.asked.pop((trial_id, fold["k"]), None) is CLAIMED:
                            continue
                        self.asked[(trial_id, fold["k"])] = self.gatherer.submit(config, fold, seed, checkpoint_dir)

    @ray.method(concurrency_group="control")
    def pending(self) -> dict[str, tuple[int, int]]:
        """{trial id: (the population that trains its last fold `queue_asked` queued and not trained
        yet: 0 the one training now, 1 the next, ...; how many it has)} of the trials with one."""
        due, out = self.gatherer.due(), {}
        with self.asked_lock:
            waiting = [(tid, due.get(r, 0)) for (tid, _), r in self.asked.items() if r is not CLAIMED and not r.done]
        for tid, rank in waiting:
            last, n = out.get(tid, (0, 0))
            out[tid] = (max(last, rank), n + 1)
        return out

    def warmup(self, config: dict, folds: list[dict]) -> dict | None:
        """One short fold of `config` (one epoch of at most 20 steps, every epoch selectable, trained
        even where the fold's screen keeps nothing: the default market's first folds), so that the
        one-time costs of a fresh device process (kernel loading, cuBLAS and cuSOLVER handles,
        the first graph capture: seconds on a GPU) are paid while Tune starts its first trials.
        Logged as a call with status "warmup"; returns its fold's status and epochs_run. Ray does
        not order it with the trials' folds (they come from other callers): where a trial's call
        came first, the warm-up is logged with no training and no length, and the first fold pays
        those costs. On a population worker, whose calls run in threads, the trials' calls come
        first (every default GPU sweep on the H100): there the first population pays them. A
        warm-up that fails does not stop the sweep: its error's first line is `warmup_error`."""
        t0 = time.time()
        if self.n_calls:  # a trial's fold reached this worker first
            self.calls.append([t0, t0, None, folds[0]["k"], "warmup"])
            return None
        small = {**config, "epochs": 1, "steps_per_epoch": min(int(config.get("steps_per_epoch", 20)), 20)}
        result = None
        try:  # its trainer is dropped at once
            result = self.gatherer.train(small | {"select_from": 0, "abstain": False}, folds[0], 0, warmup=True)
        except Exception as e:  # noqa: BLE001 - kept, not raised: nothing waits for a warm-up's result
            self.warmup_error = first_line(e)
        self.calls.append([t0, time.time(), None, folds[0]["k"], "warmup"])
        return result and {k: result[k] for k in ("status", "epochs_run")}

    def vote(self, results: dict, threads: int = 1) -> dict:
        """The vote of the sweep's full trials on this worker's data (fxray.sweep.vote), once
        the sweep's folds are done: it sets the data's fold as it goes. On the CPU it runs on
        `threads` torch threads (the other workers' too: they are idle by then)."""
        import torch

        from fxray.sweep.vote import vote_of_full_trials

        before = torch.get_num_threads()
        if self.device == "cpu":
            torch.set_num_threads(max(before, min(threads, os.cpu_count() or 1)))
        try:
            return vote_of_full_trials(results, self.data)
        finally:
            torch.set_num_threads(before)

    @ray.method(concurrency_group="control")
    def cancel(self, token: str) -> None:
        """Folds queued or running under `token` end early (their trial was stopped)."""
        self.cancelled.add(token)

    @ray.method(concurrency_group="control")
    def stats(self) -> dict:
        return {
            **{k: getattr(self, k) for k in ("index", "n_loads", "n_calls", "n_asked", "n_asked_collected")},
            "n_trainers": self.gatherer.built,
            "populations": list(self.gatherer.sizes),
            "population_runs": list(self.gatherer.runs),
            "capture_retries": self.gatherer.capture_retries,
            "calls": list(self.calls),
            **{k: getattr(self, k) for k in ("running", "restarted", "device", "load_s", "timeline", "warmup_error")},
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }


FoldWorker = ray.remote(**ACTOR_OPTIONS)(DeviceWorker)


def start_workers(arrays_ref, plan: WorkerPlan, dtype: str = "float32", name: str | None = None) -> Workers:
    """Create the pool and its FoldWorkers (they load the data in the background:
    `workers.stats()` waits for them): FoldWorkers, or of the DeviceWorker subclass that
    FXRAY_WORKER_CLASS names as "module:Class" (the fault-injection tests' workers, tests/faults.py)."""
    actor, path = FoldWorker, os.environ.get("FXRAY_WORKER_CLASS")
    if path:
        module, _, class_name = path.partition(":")
        cls = getattr(importlib.import_module(module), class_name)
        if not (isinstance(cls, type) and issubclass(cls, DeviceWorker)):
            raise ValueError(f"FXRAY_WORKER_CLASS {path}: not a subclass of fxray.sweep.workers.DeviceWorker")
        actor = ray.remote(**ACTOR_OPTIONS)(cls)
    # The ref travels inside a list so that the actor's own ray.get is the one load we count.
    # a population's trials queue up to two folds each: their calls must run at once (threads) for
    # the worker to gather them (fxray.sweep.gather); one at a time otherwise, as always
    threads = {"max_concurrency": 2 * plan.population + 2} if plan.population > 1 else {}
    handles = [
        actor.options(num_cpus=plan.num_cpus, num_gpus=plan.num_gpus, **threads).remote(
            [arrays_ref], i, plan.torch_threads, dtype, plan.population
        )
        for i in range(plan.n_workers)
    ]
    return Workers(WorkerPool.options(name=name).remote(plan.n_workers, plan.population), handles, plan)
