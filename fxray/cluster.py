"""Multi-node facts the sweep relies on: the dataset fits every node's object store,
and trial processes stay on the driver's node.

    driver:  check_object_store(arrays, path)     before ray.put: one-line error, exit 2, not a hang
             trial_resources(cpu_per_trial)       what each Tune trial asks for
    tests:   object_nodes(ref)                    the nodes holding a copy of an object

Why per node: `ray.put` writes the arrays into the driver node's object store once;
a node whose FoldWorker `ray.get`s them pulls one copy into ITS store (objects are
keyed by id, so a node never holds two), and every worker there maps that copy
zero-copy. So each node's store, not the cluster's sum
(`ray.available_resources()["object_store_memory"]`), must hold the arrays.
"""

from __future__ import annotations

import ray

# Ray starts spilling objects to disk once a node's store is 80% full
# (`object_spilling_threshold` = 0.8): the arrays must stay under that, so need
# bytes x 1/0.8 of store. The rest is room for task arguments and Tune's results.
HEADROOM = 1.25
HEAD_RESOURCE = "node:__internal_head__"  # Ray's built-in resource of the head node (1.0)


class ObjectStoreError(ValueError):
    """The dataset does not fit a node's object store; one line, exit code 2."""


def node_stores() -> dict[str, float]:
    """Object store capacity in bytes of each alive node, by node id (hex)."""
    return {n["NodeID"]: float(n["Resources"].get("object_store_memory", 0.0))
            for n in ray.nodes() if n["Alive"]}


def nbytes(arrays: dict) -> int:
    """Bytes of a dict of numpy arrays (what ray.put will store, give or take a header)."""
    return int(sum(a.nbytes for a in arrays.values()))


def check_object_store(arrays: dict, path: str, headroom: float = HEADROOM) -> dict[str, float]:
    """Refuse, before `ray.put`, a dataset that the smallest node's store cannot hold.

    Without this a too-big put falls back to disk-backed allocation or waits on
    spilling: minutes of silence instead of an error. Returns the per-node capacities.
    """
    stores = node_stores()
    size = nbytes(arrays)
    smallest = min(stores.values(), default=0.0)
    if size * headroom > smallest:
        raise ObjectStoreError(
            f"{path}: its arrays ({mib(size)}) need {mib(size * headroom)} of object store with "
            f"{headroom:g}x headroom, but the smallest node's store is {mib(smallest)} "
            f"({len(stores)} node(s)); give every node a bigger store (`ray start "
            f"--object-store-memory BYTES`, default 30% of RAM) or sweep a shorter fxcache "
            f"(python -m fxray.data ... --bars)")
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


def object_nodes(ref: ray.ObjectRef) -> list[str]:
    """Ids of the nodes whose object store holds a copy of `ref` (objects < 100 KiB
    live in the owner's memory, not in a store, and report none)."""
    from ray.experimental import get_object_locations

    return list(get_object_locations([ref], timeout_ms=10_000).get(ref, {}).get("node_ids", []))
