"""fxray.track.writer + fxray.track.runs: MLflow fed from a run directory's log, real sqlite."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from fxray.rl.experiment import read_yaml
from fxray.track import runs as mlruns
from fxray.track.records import FoldRecord
from fxray.track.writer import Writer, append_event

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


SEARCH = {"lr": {"type": "uniform", "low": 0.001, "high": 0.01}}


def make_sweep(storage, uri: str, **extra) -> dict:
    """A run directory with a sweep.json, as fxray.sweep.rundir.prepare_storage writes it."""
    storage.mkdir(exist_ok=True)
    (storage / "experiment.yaml").write_text(f"name: m\nsearch: {SEARCH}\n")  # base: chain resolved
    sweep = {
        "id": "sweep-1",
        "experiment": "m",
        "experiment_file": str(storage / "experiment.yaml"),
        "rounds": [{"seed": 3}],
        "data": {"path": "/data/x.fxcache"},
        "folds": [{"k": 0}, {"k": 1}],
        "base": {"gamma": 0.9},
        "mlflow": {"uri": uri, "experiment": "m", "tags": {"fxray.experiment": "m"}},
        **extra,
    }
    (storage / "sweep.json").write_text(json.dumps(sweep))
    return sweep


def log_fold(storage, trial_id: str, fold: int, val_sharpe, lr=0.001) -> None:
    """A folds.jsonl line, as the driver's SweepLog writes it."""
    rec = FoldRecord(fold=fold, val={"sharpe": val_sharpe}, test={"sharpe": -0.5})
    line = {**rec.flat(), "trial_id": trial_id, "config": {"lr": lr}, "t": time.time()}
    with open(storage / "folds.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def child_runs(uri: str, parent: str) -> dict:
    client = MlflowClient(uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("m").experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    return {r.data.tags["fxray.trial_id"]: r for r in runs}


def val_points(uri: str, run) -> list:
    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run.info.run_id, "val_sharpe")]


def test_the_writer_logs_what_the_log_holds(tmp_path):
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    log_fold(storage, "t1", 0, 1.5)
    log_fold(storage, "t1", 0, 9.9)  # a fold logged twice reaches MLflow once
    opened = []
    with Writer(storage, on_open=opened.append) as writer:
        assert writer.wait_open(timeout=120), writer.error
        log_fold(storage, "t1", 1, 2.5)  # appended while it runs
        append_event(storage, kind="trial_end", trial_id="t1", status="FINISHED", folds_done=2)
        assert writer.finish("FINISHED", {"best_mean_val_sharpe": 2.0}) == 0
    assert opened == [writer.parent_id]
    (child,) = child_runs(uri, writer.parent_id).values()
    assert val_points(uri, child) == [(0, 1.5), (1, 2.5)]
    assert child.data.params == {"lr": "0.001", "gamma": "0.9"} and child.data.tags["fxray.seed"] == "3"
    assert child.info.status == "FINISHED" and child.data.tags["fxray.stopped_early"] == "false"
    # every window metric of the record, not a hand-kept list
    assert set(FoldRecord().mlflow_metrics()) <= set(child.data.metrics)
    parent = MlflowClient(uri).get_run(writer.parent_id)
    assert parent.data.metrics["best_mean_val_sharpe"] == 2.0 and parent.info.status == "FINISHED"
    assert parent.data.tags["fxray.sweep_id"] == "sweep-1"
    # the run directory's experiment file, logged when the parent run was created (fxray compare)
    logged = MlflowClient(uri).download_artifacts(writer.parent_id, "experiment.yaml", str(tmp_path / "got"))
    assert read_yaml(logged) == {"name": "m", "search": SEARCH}


def test_a_writer_started_again_writes_only_what_the_store_lacks(tmp_path):
    """--resume, or a writer whose id never reached sweep.json: the parent is found by the
    sweep's id, every trial keeps one child run and every fold one point."""
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    for k in range(2):
        log_fold(storage, "t1", k, k + 0.5)  # (a Sharpe of exactly 0.0 is undefined: not logged)
    with Writer(storage) as first:
        assert first.wait_open(timeout=120)
        assert first.finish("KILLED") == 0
    log_fold(storage, "t2", 0, 5.0)
    with Writer(storage) as again:  # sweep.json still has no parent_run_id
        assert again.wait_open(timeout=120)
        assert again.finish("FINISHED") == 0
    assert again.parent_id == first.parent_id
    children = child_runs(uri, first.parent_id)
    assert sorted(children) == ["t1", "t2"]
    assert val_points(uri, children["t1"]) == [(0, 0.5), (1, 1.5)] and val_points(uri, children["t2"]) == [(0, 5.0)]
    parents = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("m").experiment_id], "tags.`fxray.sweep_id` = 'sweep-1'"
    )
    assert len(parents) == 1


def test_a_child_run_created_by_a_writer_killed_before_its_params_gets_them(tmp_path):
    """A writer killed between create_run and logging the trial's params (a drill under load
    showed it): the writer started again finds the run, logs its params once, then its folds."""
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    with Writer(storage) as first:
        assert first.wait_open(timeout=120)
        assert first.finish("KILLED") == 0
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("m").experiment_id
    bare = client.create_run(exp_id, tags={"mlflow.parentRunId": first.parent_id, "fxray.trial_id": "t1"})
    log_fold(storage, "t1", 0, 0.5, lr=0.002)
    with Writer(storage) as again:
        assert again.wait_open(timeout=120)
        assert again.finish("FINISHED") == 0
    children = child_runs(uri, first.parent_id)
    assert list(children) == ["t1"] and children["t1"].info.run_id == bare.info.run_id
    assert children["t1"].data.params["lr"] == "0.002"
    assert val_points(uri, children["t1"]) == [(0, 0.5)]


def test_a_writer_that_died_is_started_again_by_finish(tmp_path, capsys):
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    with Writer(storage) as writer:
        assert writer.wait_open(timeout=120)
        os.kill(writer.proc.pid, signal.SIGKILL)
        writer.proc.wait()
        for k in range(2):  # folds the dead writer never saw
            log_fold(storage, "t1", k, k + 0.5)
        assert writer.finish("FINISHED") == 0
    assert "starting it again" in capsys.readouterr().err
    assert val_points(uri, child_runs(uri, writer.parent_id)["t1"]) == [(0, 0.5), (1, 1.5)]


def test_a_writer_whose_driver_was_killed_writes_the_log_and_exits_quietly(tmp_path):
    """kill -9 of the driver closes both pipes: the writer's first line to it meets a broken pipe
    (issue 51 item 6: a BrokenPipe traceback, the log never written). It writes what the log
    holds, without a traceback, and ends at the EOF."""
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    for k in range(2):
        log_fold(storage, "t1", k, k + 0.5)
    cmd = [sys.executable, "-m", "fxray.track.writer", str(storage), "s"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the driver is gone: nobody reads
    proc.stdin.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("m").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert val_points(uri, child_runs(uri, parent.info.run_id)["t1"]) == [(0, 0.5), (1, 1.5)]


def test_the_writer_ignores_ctrl_c_and_reports_a_bad_store(tmp_path):
    (tmp_path / "mlflow.db").write_bytes(b"not a sqlite file" * 100)
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    errors = []
    with Writer(storage, on_error=errors.append) as writer:
        assert os.getpgid(writer.proc.pid) != os.getpgid(0)  # a terminal's Ctrl+C does not reach it
        time.sleep(1.0)
        os.kill(writer.proc.pid, signal.SIGINT)  # nor does a direct one end it
        make_sweep(storage, uri)
        assert not writer.wait_open(timeout=120)
        assert errors and "file is not a database" in errors[0] and writer.error == errors[0]
        assert writer.finish("FAILED") == -1


def test_a_writer_never_given_a_sweep_leaves_no_store(tmp_path):
    """A sweep that stops before writing sweep.json: the writer only waited; nothing is created."""
    with Writer(tmp_path / "run") as writer:
        time.sleep(3)  # long enough to have imported mlflow
    assert writer.proc.returncode == 0 and list(tmp_path.iterdir()) == []


def test_failed_writes_are_counted_and_the_rest_still_written(tmp_path):
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    log_fold(storage, "t1", 0, "not a number")
    log_fold(storage, "t2", 0, 1.0)
    with Writer(storage) as writer:
        assert writer.wait_open(timeout=120)
        assert writer.finish("FINISHED") == 1
    assert val_points(uri, child_runs(uri, writer.parent_id)["t2"]) == [(0, 1.0)]


def test_check_uri_names_the_folder_the_file_the_scheme_or_the_server(tmp_path):
    import socket

    with pytest.raises(ValueError, match="/nonexistent/dir is not a writable folder"):
        mlruns.check_uri("sqlite:////nonexistent/dir/mlflow.db")
    (tmp_path / "junk.db").write_bytes(b"not a database" * 10)
    with pytest.raises(ValueError, match="junk.db is not an SQLite database"):
        mlruns.check_uri(f"sqlite:///{tmp_path / 'junk.db'}")
    with pytest.raises(ValueError, match="'mlflw' is not a store MLflow opens"):
        mlruns.check_uri("mlflw://localhost")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match="no tracking server answers there"):
        mlruns.check_uri(f"http://127.0.0.1:{port}")
    mlruns.check_uri(f"sqlite:///{tmp_path / 'new.db'}")  # none yet: created when opened


def test_a_store_whose_maker_is_killed_mid_tables_is_absent_not_broken(tmp_path):
    """MLflow makes a new sqlite store's tables one migration at a time; a writer killed while it
    does (a loaded box) left a file no later open accepted, and the restarted writer failed the
    sweep. The tables are made aside: killed at the first sign of them, no store exists, and the
    next writer makes a whole one. Without create_sqlite_store the kill leaves a partial mlflow.db."""
    db = tmp_path / "mlflow.db"
    code = f"from fxray.track import runs; runs.Tracker('sqlite:///{db}', 'm')"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 120
    while not list(tmp_path.glob("*mlflow.db*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not db.exists()  # killed while its tables were being made: nothing in the store's place
    tracker = mlruns.Tracker(f"sqlite:///{db}", "m")
    assert MlflowClient(f"sqlite:///{db}").get_run(tracker.parent_run_id).info.status == "RUNNING"


def test_a_folds_baselines_are_kept_once_apart_and_reach_mlflow_and_results_whole(tmp_path):
    """Every trial of a fold reports the same references' returns (~0.1 MB): the trial moves them
    into one file of the run directory, named by their content, and folds.jsonl names it; the
    MLflow writer and results.json read them back whole, as if they had been in the line."""
    from fxray.track.records import put_baselines
    from fxray.track.results import load_records

    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri)
    hours = list(range(500))
    periods = {"oracle": {"test": {"net": [0.001 * h for h in hours], "hours": hours, "n_days": 21}}}
    for tid in ("t1", "t2"):
        rec = FoldRecord(
            fold=0, val={"sharpe": 1.0}, test={"sharpe": 0.5}, baseline_periods=json.loads(json.dumps(periods))
        )
        put_baselines(storage, rec)
        line = {**rec.flat(), "trial_id": tid, "config": {"lr": 0.001}, "t": time.time()}
        with open(storage / "folds.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
    (kept,) = (storage / "baselines").iterdir()  # one file for both trials
    lines = [json.loads(x) for x in (storage / "folds.jsonl").read_text().splitlines()]
    assert {x["baselines_file"] for x in lines} == {f"baselines/{kept.name}"}
    assert all(x["baseline_periods"] == {} for x in lines) and len(json.dumps(lines[0])) < 2000
    assert all(r["baseline_periods"] == periods for r in load_records(storage).values())
    with Writer(storage) as writer:
        assert writer.wait_open(timeout=120), writer.error
        for tid in ("t1", "t2"):
            append_event(storage, kind="trial_end", trial_id=tid, status="FINISHED", folds_done=1)
        assert writer.finish("FINISHED", {}) == 0
    client = MlflowClient(uri)
    for run in child_runs(uri, writer.parent_id).values():
        path = client.download_artifacts(
            run.info.run_id, f"{mlruns.RETURNS_DIR}/fold0.json", str(tmp_path / run.info.run_id)
        )
        assert json.loads(open(path).read())["baselines"] == periods
