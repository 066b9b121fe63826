"""Ray itself for a sweep: starting or joining it, and the multi-node facts the sweep
relies on: the dataset fits every node's object store, trial processes stay on the
driver's node.

    driver:  start_ray(args)                      a local Ray, or join --address (ClusterError)
             check_object_store(arrays, path)     before ray.put: one-line error, exit 2, not a hang
             plan_workers(resources, ...)         how many FoldWorkers, trials in flight, CPUs each
             trial_resources(cpu_per_trial)       what each Tune trial asks for

Why per node: `ray.put` writes the arrays into the driver node's object store once;
a node whose FoldWorker `ray.get`s them pulls one copy into ITS store (objects are
keyed by id, so a node never holds two), and every worker there maps that copy
zero-copy. So each node's store, not the cluster's sum
(`ray.available_resources()["object_store_memory"]`), must hold the arrays.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass

import ray

# Ray starts spilling objects to disk once a node's store is 80% full
# (`object_spilling_threshold` = 0.8): the arrays must stay under that, so need
# bytes x 1/0.8 of store. The rest is room for task arguments and Tune's results.
HEADROOM = 1.25
HEAD_RESOURCE = "node:__internal_head__"  # Ray's built-in resource of the head node (1.0)


class ObjectStoreError(ValueError):
    """The dataset does not fit a node's object store; one line, exit code 2."""


class ClusterError(ValueError):
    """No Ray cluster at --address; one line, exit code 2."""


def node_stores() -> dict[str, float]:
    """Object store capacity in bytes of each alive node, by node id (hex)."""
    return {n["NodeID"]: float(n["Resources"].get("object_store_memory", 0.0)) for n in ray.nodes() if n["Alive"]}


def check_object_store(arrays: dict, path: str) -> dict[str, float]:
    """Refuse, before `ray.put`, a dataset that the smallest node's store cannot hold.

    Without this a too-big put falls back to disk-backed allocation or waits on
    spilling: minutes of silence instead of an error. Returns the per-node capacities.
    """
    stores = node_stores()
    size = sum(a.nbytes for a in arrays.values())  # what ray.put stores, give or take a header
    smallest = min(stores.values(), default=0.0)
    if size * HEADROOM > smallest:
        raise ObjectStoreError(
            f"{path}: its arrays ({mib(size)}) need {mib(size * HEADROOM)} of object store with "
            f"{HEADROOM:g}x headroom, but the smallest node's store is {mib(smallest)} "
            f"({len(stores)} node(s)); give every node a bigger store (`ray start "
            f"--object-store-memory BYTES`, default 30% of RAM) or sweep a shorter fxcache "
            f"(fxray data ... --bars)"
        )
    return stores


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def trial_resources(cpu_per_trial: float) -> dict:
    """The resources of one Tune trial process.

    On a multi-node cluster the trials are pinned to the head node (a sliver of its
    built-in `node:__internal_head__` resource): Tune keeps the run directory there,
    and since Ray 2.7 a trial on another node that reports a checkpoint into a local
    (non-shared) storage path fails ("Unable to set up cluster storage"). Trials only
    wait on FoldWorkers (no torch, no CUDA), so the head's CPUs carry them all:
    concurrent trials = FoldWorkers x sweep.trials_per_worker, each `cpu_per_trial`
    CPUs of the head.
    """
    res = {"cpu": cpu_per_trial}
    if len(node_stores()) > 1:
        res[HEAD_RESOURCE] = 0.001  # 1000 concurrent trials per head, far more than workers
    return res


LOCAL_IP = "127.0.0.1"
REAPERS: list = []  # held for the process's life: a reaper acts when its stdin pipe closes


# a sweep that cannot start: set by the driver's threads (a FoldWorker that could not load, the
# MLflow writer's store that could not open), read by the driver and fxray.sweep.tuner.StartFailed
WORKER_FAILURE: list[str] = []
MLFLOW_FAILURE: list[str] = []


def start_ray(args) -> None:
    """Join a cluster (--address) or start a local one; dashboard off.

    A local Ray listens on 127.0.0.1 only (GCS, raylet, object manager, every worker and
    agent): Ray 2.60 binds its gRPC servers to all interfaces unless its node IP is the
    loopback one, and turns `_node_ip_address="127.0.0.1"` into the machine's address
    unless it is told there is no cluster (ray_constants.ENABLE_RAY_CLUSTER, the switch
    behind RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER). A cluster run (--address) binds as its nodes
    were started (`ray start --node-ip-address <private IP>`: docs/cluster.md). A local
    session's reaper (fxray.sweep.reaper) is kept in REAPERS. A Ray already started in this
    process is kept: the placebo sweeps (fxray.sweep.placebo) run in the real one's."""
    if ray.is_initialized():
        return

    # Our SweepLog prints a line per fold: Tune's own tables and its warning about the
    # per-fold state snapshot (wanted: it makes --resume lose nothing) would drown it.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's default TensorBoard logger imports tensorboardX, which imports torch into the
    # driver (~10 s on the GPU machines): make_tuner asks for the JSON and CSV loggers only.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    kw = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if args.address:
        host, _, port = args.address.rpartition(":")
        if host and port.isdigit():  # Ray retries a dead address for minutes: probe it first
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except OSError as e:
                raise ClusterError(
                    f"--address {args.address}: nothing answers there ({e.strerror or e}); "
                    "is the cluster up (ray status)?"
                ) from None
        try:
            ray.init(address=args.address, **kw)
        except (ConnectionError, RuntimeError) as e:
            raise ClusterError(
                f"--address {args.address}: cannot join the Ray cluster "
                f"({str(e).strip().splitlines()[0]}); is it up (ray status)?"
            ) from None
        return
    import ray._private.ray_constants as ray_constants

    from fxray.sweep.logs import local_ray_env
    from fxray.sweep.reaper import start_reaper

    local_ray_env()
    # without --address the sweep's Ray is its own (address "local"): ray.init() would join the
    # newest cluster that `ray start` left on this machine, or an inherited RAY_ADDRESS's, and then
    # refuse num_cpus with a traceback (seen in CI beside tests/test_cluster.py's `ray start`)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the processes Ray starts see it too
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time by ray._private.services
    ray.init("local", num_cpus=args.num_cpus, num_gpus=args.num_gpus, _node_ip_address=LOCAL_IP, **kw)
    node = ray._private.worker._global_node
    REAPERS.append(start_reaper(node.node_id, node.get_session_dir_path()))  # its pipe open until we exit


# --- how many workers, with which resources ------------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    kind: str  # "gpu": one actor per 1/K GPU; "cpu": CPU-only actors
    n_workers: int
    num_cpus: float  # logical CPUs each worker reserves
    num_gpus: float  # 1/K in gpu plans, 0 in cpu plans
    torch_threads: int  # intra-op threads of each worker
    n_trials: int  # Tune trials in flight (max_concurrent_trials)
    population: int = 1  # trials a worker trains together (fxray.sweep.gather); 1: one at a time
    cpu_per_trial: float = 0.25  # what each Tune trial reserves (it only waits on a worker)

    def describe(self) -> str:
        per = f"{self.num_gpus:g} GPU + " if self.kind == "gpu" else ""
        pop = f", populations of up to {self.population}" if self.population > 1 else ""
        return (
            f"{self.n_workers} {self.kind.upper()} worker(s), each {per}{self.num_cpus:g} CPU, "
            f"{self.torch_threads} torch thread(s){pop}; {self.n_trials} trials in flight"
        )


def plan_workers(
    resources: dict,
    workers_per_gpu: int = 1,
    cpu_per_trial: float = 0.25,
    cpu_workers: int | None = None,
    trials_per_worker: int = 1,
    population: int = 1,
    max_trials: int | None = None,
) -> WorkerPlan:
    """Split the cluster between workers and the trials that drive them.

    `trials_per_worker` trials are in flight per worker: one holds its lease, the
    others have been started by Tune and wait for it, so a worker goes from one
    trial to the next without waiting for Tune's trial turnover (~0.1 s).
    With `population` K > 1, K trials share a worker (their folds trained as one population)
    and one more waits: at least K + 1 trials in flight per worker.
    No more trials are in flight than `max_trials` (the sweep's). Trials only wait on workers,
    but Ray still needs room for their `cpu_per_trial`: on a CPU cluster they reserve at most
    half of it between them (less than `cpu_per_trial` each where that would not fit), so any
    population fits any machine; a worker gets at most its threads' CPUs, the rest of it.
    """
    cpus, gpus = float(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    if gpus >= 1:
        kind, n, num_gpus, threads = "gpu", gpus * workers_per_gpu, 1.0 / workers_per_gpu, 1
    else:
        kind, num_gpus = "cpu", 0.0
        n = cpu_workers or max(1, int(cpus))  # one single-threaded worker per core beats one wide one
        threads = max(1, int(cpus // n))
    n_trials = n * (max(trials_per_worker, population + 1) if population > 1 else trials_per_worker)
    n_trials = max(1, min(n_trials, max_trials or n_trials))
    if kind == "cpu":  # Ray counts hundredths of a CPU
        cpu_per_trial = max(0.01, min(cpu_per_trial, math.floor(cpus / 2 / n_trials * 100) / 100))
    spare = (cpus - n_trials * cpu_per_trial) / n
    num_cpus = math.floor(min(float(threads if kind == "cpu" else 1), spare) * 100) / 100
    return WorkerPlan(kind, n, max(num_cpus, 0.0), num_gpus, threads, n_trials, population, cpu_per_trial)
