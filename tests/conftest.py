"""Shared fixtures: small synthetic markets written once per test session."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# One thread a process for torch's and numpy's OpenMP pools, set before they load, so that the
# CLIs the tests start (fxray.train, fxray.export, scripts/...) inherit it: `pytest -n 2` runs two
# processes on CI's 2 cores, and two threads each oversubscribe them. On this 2-core box, loaded,
# a test of a tiny fold's training took 30 s on two threads and 0.6 s on one (lab/benchmarks-history.md).
# The numbers do not depend on it: `fxray.train --from-run` on two threads reproduced a sweep's
# one-thread folds bit for bit (tests/test_compare.py) before this line was added.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One Ray auth token for every process of the suite, whatever HOME says: tests/test_tour.py runs
# Ray in its pytest process under a fresh HOME, and Ray keeps the token it read there for the rest
# of the process; a later in-process local cluster (tests/test_cluster.py) then starts its GCS
# with the real HOME's token and refuses its own driver ("InvalidAuthToken").
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

import pytest  # noqa: E402
import torch  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SHARED_DATA = Path(os.environ.get("FXRAY_SHARED_DATA", SHARED / "data"))

# Tests run on the CPU with a fixed thread count: results do not depend on the box.
torch.set_num_threads(1)


# --- pytest -n N: the tests that share a costly fixture in one process -------------------------

# Modules whose tests share a module- or session-scoped fixture that costs a sweep, a training,
# a Ray or a big file (2-50 s). Under pytest-xdist each goes to one process as a unit, so that
# its fixture is made once a suite, not once in each process; every other test is sent alone,
# as xdist's default (load) does. (xdist's --dist loadgroup would do it by marks, but with
# pytest 9.2 it no longer groups anything: pytest-xdist issue #1386.) {module: group}
XDIST_GROUPS = {
    "tests/test_compare.py": "a real tiny sweep",  # store + sweep_t
    "tests/test_policy.py": "eurusd_trained",  # + bundles
    "tests/test_live.py": "eurusd_trained",  # + bundle_dirs
    "tests/test_workers.py": "a Ray and two FoldWorkers",  # pool
    "tests/test_cluster.py": "a two-node Ray",  # two_nodes
    "tests/test_book_features.py": "an ES day of book and trades",  # es
    "tests/test_cache.py": "a million-row fxcache",  # big
    "tests/test_tour.py": "the README's commands, one sweep",  # tour: its steps share the sweep
}


def pytest_collection_modifyitems(items):
    """The `slow` tests (whole sweeps, trainings: 20-150 s each) first, each group kept in its
    order: xdist sends single tests in collection order, and the slow ones sit in the modules
    that sort last (test_learning, test_placebo, test_tune), so one process ran them at the end
    while the other sat idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own choice; xdist may be off
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":  # the default of -n N; an explicit --dist is kept
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        """LoadScopeScheduling with a work unit a group of XDIST_GROUPS or else one test (the
        groups are sent first: its default order is by tests in a unit, most first)."""

        def _split_scope(self, nodeid: str) -> str:
            return XDIST_GROUPS.get(nodeid.split("::", 1)[0], nodeid)

    return SharedFixtureScheduling(config, log)


@pytest.fixture
def one_torch_thread():
    """One torch thread for a test that trains, as the sweep's CPU workers train, whatever the
    process's default (one above): with pytest -n 2 on 2 cores, two processes of 2 threads each
    oversubscribe the cores (~2-3x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def short_folds_experiment(tmp_path_factory) -> Path:
    """The default experiment with its CPU profile's folds cut to 20 days' training and 5-day val
    and test windows (at most 4), for the train CLI's tests on the 60k-bar markets below (~41 days:
    the profile's first fold needs 105)."""
    default = Path(__file__).resolve().parents[1] / "experiments/default.yaml"
    path = tmp_path_factory.mktemp("exp") / "default_short.yaml"
    folds = "{train: 20d, val: 5d, test: 5d, max_folds: 4}"
    path.write_text(f"base: {default}\nname: default\ncpu: {{folds: {folds}}}\n")
    return path


@pytest.fixture(scope="session")
def synth_cache(tmp_path_factory) -> Path:
    """60k bars (~8 weeks of a 24x5 market) of the planted-signal market, seed 0."""
    from fxray.data.synth import SynthSpec, to_cache

    path = tmp_path_factory.mktemp("synth") / "synth60k.fxcache"
    to_cache(SynthSpec(n_bars=60_000, seed=0), path)
    return path


STRONG = dict(beta=0.10, persistence=0.95, ofi_noise=0.0, ofi_span=1)  # ofi[:, 0] is the signal itself


@pytest.fixture(scope="session")
def strong_cache(tmp_path_factory) -> Path:
    """60k bars of a market whose signal is strong and observed directly (the pre-2 default):
    for tests that a learner learns at all, in seconds."""
    from fxray.data.synth import SynthSpec, to_cache

    path = tmp_path_factory.mktemp("strong") / "strong60k.fxcache"
    to_cache(SynthSpec(n_bars=60_000, seed=0, **STRONG), path)
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


EURUSD_JAN = "bars/eurusd_m1_2017q1/DAT_ASCII_EURUSD_M1_201701.csv"


@pytest.fixture(scope="session")
def eurusd_trained(tmp_path_factory, shared_data) -> dict:
    """A real tiny training on real bars: the shared EURUSD January 2017 HistData bars built
    into an fxcache, `python -m fxray.train` on it (experiments/smoke.yaml: 2 folds, a 32x2
    network, CPU; ~10 s) with --checkpoint-dir and --json. Paths of all of it."""
    import json
    import subprocess
    import sys

    from fxray.data.bars import build_cache, load_bars

    d = tmp_path_factory.mktemp("eurusd")
    bars = load_bars(shared_data / EURUSD_JAN, fmt="histdata")
    build_cache(bars, d / "jan.fxcache", instrument="EURUSD", source=str(bars.source))
    root = Path(__file__).resolve().parents[1]
    cmd = [
        sys.executable,
        "-m",
        "fxray.train",
        "--data",
        d / "jan.fxcache",
        "--experiment",
        root / "experiments/smoke.yaml",
    ]
    cmd += ["--device", "cpu", "--checkpoint-dir", d / "ckpt", "--json", d / "train.json"]
    out = subprocess.run([str(c) for c in cmd], cwd=d, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return {
        "dir": d,
        "bars": bars,
        "cache": d / "jan.fxcache",
        "checkpoints": d / "ckpt" / "seed0",
        "train": json.loads((d / "train.json").read_text()),
    }


def one_batch(dqns: dict, first, before=lambda key: None) -> dict:
    """{key: (TD loss, |Q| max, gradients), on the CPU} of one batch for each DQN of `dqns` (begun):
    20 collect steps of dqns[first], its replay rows copied into the others, a batch sampled there
    (the same rows and weights for all: what differs is each one's device or precision).
    `before(key)` runs before each one's loss (a process-wide switch such as TF32)."""
    source = dqns[first]
    for _ in range(20):
        source.collect()
    for dqn in dqns.values():
        for name in ("replay_t", "replay_position", "replay_action", "replay_reward", "replay_done", "replay_steps"):
            if dqn is not source:
                getattr(dqn, name).copy_(getattr(source, name))
    step, env = source.sample_indices()
    out = {}
    for key, dqn in dqns.items():
        before(key)
        loss, q_max = dqn.td_loss(step.to(dqn.data.device), env.to(dqn.data.device), None)
        loss.sum().backward()
        out[key] = (loss.detach().cpu(), q_max.cpu(), [p.grad.cpu() for p in dqn.params])
    return out
