"""Beyond one machine: cluster.yaml against Ray's own schema, and a two-node Ray
simulated on this box (`ray.cluster_utils.Cluster`: two raylets, each its own object store).

The simulation checks the data placement of DESIGN.md on real Ray: the driver puts the
arrays once, the second node receives one copy into its own store, and each FoldWorker
(one per node, forced by one logical GPU per node) loads them once.
"""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.cluster_utils import Cluster

from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.synth import SynthSpec, to_cache
from fxray.sweep.cluster import HEAD_RESOURCE, ObjectStoreError, check_object_store, plan_workers, trial_resources
from fxray.sweep.workers import put_market, start_workers

ROOT = Path(__file__).resolve().parents[1]
STORE = 80 * 2**20  # bytes of object store per simulated node (Ray's minimum is 75 MiB)
TINY = {
    "num_envs": 16,
    "batch_size": 64,
    "hidden": 16,
    "buffer_steps": 32,
    "episode_len": 32,
    "epochs": 1,
    "steps_per_epoch": 5,
    "patience": 1,
}


# --- cluster.yaml, offline -----------------------------------------------------------


def object_nodes(ref) -> list[str]:
    """Ids of the nodes whose object store holds a copy of `ref` (objects < 100 KiB
    live in the owner's memory, not in a store, and report none)."""
    from ray.experimental import get_object_locations

    return list(get_object_locations([ref], timeout_ms=10_000).get(ref, {}).get("node_ids", []))


def load_cluster_yaml() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def validate(config: dict) -> dict:
    """What `ray up` does first: fill in the provider's defaults, then Ray's JSON schema."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_cluster_yaml_is_valid_for_ray():
    config = load_cluster_yaml()
    prepared = validate(config)
    assert prepared["provider"]["type"] == "aws"
    gpu = prepared["available_node_types"]["gpu8"]
    assert gpu["max_workers"] <= prepared["max_workers"]
    # the dashboard and job API on loopback only; MLflow on the private address
    assert "--dashboard-host=127.0.0.1" in " ".join(config["head_start_ray_commands"])
    assert "hostname -I" in " ".join(config["head_start_ray_commands"])
    text = (ROOT / "cluster.yaml").read_text()
    for secret in ("aws_access_key_id", "aws_secret_access_key", "AKIA", "BEGIN RSA"):
        assert secret not in text


# provider: and node_config: are free-form in Ray's schema (AWS itself checks them at `ray up`)
@pytest.mark.parametrize("where", ["top", "node_type"])
def test_cluster_yaml_misspelt_key_is_refused(where):
    config = load_cluster_yaml()
    if where == "top":
        config["setup_comands"] = config.pop("setup_commands")
        bad = "setup_comands"
    elif where == "node_type":
        node = config["available_node_types"]["gpu8"]
        node["min_worker"] = node.pop("min_workers")
        bad = "min_worker"
    else:
        raise AssertionError(where)
    import jsonschema

    with pytest.raises(jsonschema.ValidationError, match=bad):
        validate(config)


# --- two nodes on one box -------------------------------------------------------------


@pytest.fixture(scope="module")
def two_nodes():
    """Head + one worker node, each 1 CPU, 1 logical GPU and an 80 MiB object store."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 1, "object_store_memory": STORE, "include_dashboard": False},
    )
    worker_node = cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=STORE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="fxray-test-cluster")
    try:
        yield cluster, worker_node
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_data_reaches_each_node_once_and_each_worker_loads_once(two_nodes, synth_cache):
    cluster, worker_node = two_nodes
    head_id, worker_id = cluster.head_node.node_id, worker_node.node_id
    market = cache.open(synth_cache)
    ref = put_market(market)
    assert object_nodes(ref) == [head_id]  # ray.put: the driver's node only
    plan = plan_workers(ray.cluster_resources(), workers_per_gpu=1, cpu_per_trial=0.25)
    assert (plan.kind, plan.n_workers, plan.num_gpus) == ("gpu", 2, 1.0)
    workers = start_workers(ref, plan, name="test-cluster-pool")
    stats = workers.stats(timeout=120)
    assert [s["n_loads"] for s in stats] == [1, 1]
    assert {s["node"] for s in stats} == {head_id, worker_id}  # one worker per GPU, across nodes
    # The transfer, from the GCS's object directory: one copy per node's store (a store
    # holds an object id at most once, so "on both nodes" means "sent to the second once").
    assert sorted(object_nodes(ref)) == sorted([head_id, worker_id])
    # Each worker trains from its node's copy; nothing is loaded again.
    fold = make_folds(market.ts, FoldSpec("6d", "2d", "2d", max_folds=1))[0].as_dict()
    results = [next(workers.run_folds(i, TINY, [fold], 0)) for i in range(plan.n_workers)]
    assert {r["worker"] for r in results} == {0, 1}
    assert [s["n_loads"] for s in workers.stats()] == [1, 1]
    assert sorted(object_nodes(ref)) == sorted([head_id, worker_id])
    # Tune trials go to the head (the run directory is local there); a sliver of its resource.
    assert trial_resources(0.25) == {"cpu": 0.25, HEAD_RESOURCE: 0.001}
    for h in [*workers.handles, workers.pool]:
        ray.kill(h)


def test_fxcache_bigger_than_a_node_store_exits_2_with_one_line(two_nodes, tmp_path):
    """Through the real CLI joining the running two-node cluster (--address): nothing starts."""
    cluster, _ = two_nodes
    big = tmp_path / "big.fxcache"
    to_cache(SynthSpec(n_bars=330_000, seed=1), big)  # 330k bars x 224 B = 70 MiB of arrays
    market = cache.open(big)
    with pytest.raises(ObjectStoreError, match="big.fxcache"):
        put_market(market)  # refused before ray.put: nothing is written to the store
    assert check_object_store({"close": market.close.copy()}, str(big))  # 2.5 MiB fits: no error
    exp = tmp_path / "tiny.yaml"
    exp.write_text(
        "name: t\ndata: {path: null}\nfolds: {train: 4d, val: 2d, test: 2d, max_folds: 1}\n"
        "search: {lr: {type: loguniform, low: 1.0e-4, high: 3.0e-3}}\nsweep: {trials: 1}\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONWARNINGS": "ignore"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fxray.tune",
            "--experiment",
            str(exp),
            "--data",
            str(big),
            "--address",
            cluster.address,
            "--storage",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("fxray.tune: error:")]
    assert len(errors) == 1, out.stderr[-2000:]
    assert "big.fxcache" in errors[0] and "70 MiB" in errors[0] and "80 MiB" in errors[0]
    assert "--object-store-memory" in errors[0]
    assert not (tmp_path / "run").exists()  # refused before the run directory was made
