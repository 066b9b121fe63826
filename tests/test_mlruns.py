"""fxray.mlhelper + fxray.mlruns: the sweep's MLflow client in its helper process, real sqlite."""

import os
import signal
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from fxray import mlhelper, mlruns

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


def sweep_dict(uri: str) -> dict:
    return {"experiment": "m", "rounds": [{"seed": 3}], "data": {"path": "/data/x.fxcache"},
            "mlflow": {"uri": uri, "experiment": "m", "tags": {"fxray.experiment": "m"}}}


def test_the_helper_process_logs_what_the_driver_asks(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mlhelper.TrackerProcess(uri) as store:
        time.sleep(0.5)
        assert not (tmp_path / "mlflow.db").exists()  # readied beside it, moved in on open
        tracker = store.open_sweep(sweep_dict(uri))
        assert (tmp_path / "mlflow.db").exists()
        assert [p.name for p in tmp_path.iterdir()] == ["mlflow.db"]
        parent = tracker.parent_id()
        tracker.log_fold("t1", "trial-t1", {"lr": 0.001}, {"fold": 0, "val_sharpe": 1.5, "test_sharpe": -0.5})
        tracker.log_fold("t1", "trial-t1", {"lr": 0.001}, {"fold": 0, "val_sharpe": 9.9})  # logged once only
        tracker.log_fold("t1", "trial-t1", {"lr": 0.001}, {"fold": 1, "val_sharpe": 2.5})
        tracker.end_trial("t1", 2, 2)
        tracker.end_sweep("FINISHED", {"best_mean_val_sharpe": 2.0})
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("m").experiment_id])
    child = next(r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent)
    assert [(m.step, m.value) for m in client.get_metric_history(child.info.run_id, "val_sharpe")] == [(0, 1.5), (1, 2.5)]
    assert child.data.params == {"lr": "0.001"} and child.data.tags["fxray.seed"] == "3"
    assert child.info.status == "FINISHED"
    assert client.get_run(parent).data.metrics["best_mean_val_sharpe"] == 2.0


def studies_readied(pid: int) -> list:
    """The temporary study folders helper `pid` made (other tests' helpers may still be exiting)."""
    return list(Path(tempfile.gettempdir()).glob(f"fxray-study-{pid}-*"))


def test_a_helper_never_opened_leaves_no_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = mlhelper.TrackerProcess(uri, tmp_path / "run" / "optuna.db")
    time.sleep(4)  # long enough for it to have readied both stores' tables
    store.close()
    assert store.proc.returncode == 0 and list(tmp_path.iterdir()) == []
    assert studies_readied(store.proc.pid) == []


def test_the_study_file_is_readied_and_moved_in_on_open(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mlhelper.TrackerProcess(uri, tmp_path / "run" / "optuna.db") as store:
        (tmp_path / "run").mkdir()  # what prepare_storage does before the sweep opens
        store.open_sweep(sweep_dict(uri))
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["optuna.db"]
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'run' / 'optuna.db'}")
    study.tell(study.ask(), 1.0)
    assert len(study.trials) == 1


def test_the_helper_ignores_ctrl_c_and_reports_a_bad_store(tmp_path):
    (tmp_path / "mlflow.db").write_bytes(b"not a sqlite file" * 100)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mlhelper.TrackerProcess(uri) as store:
        assert os.getpgid(store.proc.pid) != os.getpgid(0)  # a terminal's Ctrl+C does not reach it
        time.sleep(1.0)
        os.kill(store.proc.pid, signal.SIGINT)  # nor does a direct one end it
        with pytest.raises(Exception, match="file is not a database"):
            store.open_sweep(sweep_dict(uri))
        assert store.proc.poll() is None


def test_check_uri_names_the_folder():
    with pytest.raises(ValueError, match="/nonexistent/dir is not a writable folder"):
        mlruns.check_uri("sqlite:////nonexistent/dir/mlflow.db")
    mlruns.check_uri("http://127.0.0.1:5000")  # a server: checked when opened


def test_queued_writes_outlive_the_driver_and_failures_are_counted(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mlhelper.TrackerProcess(uri) as store:
        tracker = store.open_sweep(sweep_dict(uri))
        parent = tracker.parent_id()
        tracker.log_fold("t1", "trial-t1", {"lr": 0.1}, {"fold": 0, "val_sharpe": "not a number"})
        assert tracker.end_sweep("RUNNING") == 1  # waited for the queue: one write failed
        for k in range(5):
            tracker.log_fold("t2", "trial-t2", {"lr": 0.2}, {"fold": k, "val_sharpe": float(k)})
    # closed right after queueing (as a driver that dies would): the helper drained the queue first
    assert store.proc.returncode == 0
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("m").experiment_id],
                              f"tags.mlflow.parentRunId = '{parent}' and tags.fxray.trial_id = 't2'")
    assert [m.value for m in client.get_metric_history(runs[0].info.run_id, "val_sharpe")] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_the_opening_tracker_replays_what_came_before_the_store_opened(tmp_path):
    """Folds logged while the helper is still opening the sweep are written once it is,
    in order; a sweep whose opening fails reports it once, and drops what comes after."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with mlhelper.TrackerProcess(uri) as store:
        opened, errors = [], []
        tracker = mlhelper.OpeningTracker(store, sweep_dict(uri), opened.append, errors.append)
        for k in range(3):  # at once: the helper is still importing mlflow
            tracker.log_fold("t1", "trial-t1", {"lr": 0.1}, {"fold": k, "val_sharpe": float(k)})
        assert not opened
        assert tracker.wait(timeout=120) and errors == []
        tracker.log_fold("t1", "trial-t1", {"lr": 0.1}, {"fold": 3, "val_sharpe": 3.0})
        tracker.end_trial("t1", 4, 4)
        assert tracker.end_sweep("FINISHED") == 0
        assert opened == [tracker.parent_id()]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("m").experiment_id],
                              f"tags.mlflow.parentRunId = '{opened[0]}'")
    assert [m.value for m in client.get_metric_history(runs[0].info.run_id, "val_sharpe")] == [0.0, 1.0, 2.0, 3.0]
    assert runs[0].info.status == "FINISHED"

    def cannot_record(parent_id):
        raise OSError("No space left on device: sweep.json")

    with mlhelper.TrackerProcess(uri) as store:
        errors = []
        tracker = mlhelper.OpeningTracker(store, sweep_dict(uri), cannot_record, errors.append)
        assert not tracker.wait(timeout=120)
        assert errors == ["No space left on device: sweep.json"]
        tracker.log_fold("t2", "trial-t2", {"lr": 0.2}, {"fold": 0, "val_sharpe": 1.0})  # dropped, no raise
        assert tracker.end_sweep("FAILED") == 0 and tracker.pending == []
