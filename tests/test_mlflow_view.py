"""What MLflow shows of a sweep: undefined metrics left out, units in the names, the trials
ranked in a saved view with their key metrics as columns, the parent's summary and the URLs
that open on them, at the address `mlflow ui` listens on (real sqlite store, real writer); and
the sweep's progress line (its denominator and ETA under ASHA)."""

import json
import urllib.parse

import pytest
from mlflow.tracking import MlflowClient
from test_writer import child_runs, log_fold, make_sweep

from fxray.sweep.callbacks import SweepLog, expected_folds
from fxray.track import links
from fxray.track.records import FoldRecord
from fxray.track.writer import Writer, append_event

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

WINDOW = dict(sharpe=1.2, sortino=2.5, max_drawdown=-0.02, calmar=3.0, total_return=0.01)
WINDOW.update(turnover=0.1, n_trades=5, hit_rate=0.55, n_days=5)
V = {"t1": 1.0, "t2": 3.0, "t3": 2.0}  # each trial's val Sharpe


def test_undefined_metrics_are_not_logged_and_log_units_are_named():
    flat = dict(WINDOW, sharpe=0.0, sortino=0.0, calmar=0.0, n_trades=0, hit_rate=0.0)  # a flat window
    rec = FoldRecord(val=WINDOW, test=flat, bh_test_sharpe=0.0, val_score=float("nan"))
    m = rec.mlflow_metrics()
    assert m["val_sharpe"] == 1.2 and m["val_sortino"] == 2.5 and m["val_calmar"] == 3.0
    assert m["val_max_drawdown_log"] == -0.02 and m["val_total_return_log"] == 0.01
    assert "val_max_drawdown" not in m and "val_total_return" not in m
    for undefined in ("test_sharpe", "test_sortino", "test_calmar", "test_hit_rate", "bh_test_sharpe", "val_score"):
        assert undefined not in m, undefined
    # defined zeros stay: a window with no drawdown, no trades, no turnover
    assert m["test_max_drawdown_log"] == -0.02 and m["test_n_trades"] == 0.0 and m["test_turnover"] == 0.1
    # the other forms keep the metric module's own names and values
    assert rec.results_json()["test"]["sortino"] == 0.0 and "max_drawdown" in rec.results_json()["val"]


def test_urls_open_the_runs_view_on_the_sweeps_trials():
    url = links.runs_url("http://127.0.0.1:5000", "7", "abc")
    path, _, query = url.partition("?")
    assert path == "http://127.0.0.1:5000/#/experiments/7/runs"
    # only the saved view's key: a searchFilter in the URL would make MLflow ignore the view
    assert dict(urllib.parse.parse_qsl(query)) == {"viewStateShareKey": "abc", "workflowType": "machine_learning"}
    m = dict(urllib.parse.parse_qsl(links.metric_url("", "7", ["r1", "r2"], "val_sharpe").partition("?")[2]))
    assert json.loads(m["runs"]) == ["r1", "r2"] and m["x_axis"] == "step" and json.loads(m["metric"]) == "val_sharpe"
    assert links.rank_tags(["a", "b", "c"]) == {"a": "01", "b": "02", "c": "03"}
    assert list(links.rank_tags([str(i) for i in range(120)]).values())[:2] == ["001", "002"]


def test_the_ui_address_is_where_mlflow_ui_listens():
    """A local store's UI is where `mlflow ui` listens: its own MLFLOW_HOST / MLFLOW_PORT /
    MLFLOW_STATIC_PREFIX (the printed command spells them out); a tracking server is its own UI."""
    store = "sqlite:////x/mlflow.db"
    assert links.ui_base(store, {}) == "http://127.0.0.1:5000"
    assert links.ui_command(store, {}) == f"mlflow ui --backend-store-uri {store}"
    env = {"MLFLOW_PORT": "8123", "MLFLOW_HOST": "0.0.0.0", "MLFLOW_STATIC_PREFIX": "/ml"}
    assert links.ui_base(store, env) == "http://127.0.0.1:8123/ml"  # bound to every interface: open it here
    assert links.ui_command(store, env).endswith(" --host 0.0.0.0 --port 8123 --static-prefix /ml")
    assert links.ui_base(store, {"MLFLOW_HOST": "::1"}) == "http://[::1]:5000"
    assert links.ui_base("http://tracking:8080/", env) == "http://tracking:8080"
    assert links.ui_command("https://tracking", env) is None


def test_the_end_of_a_sweep_ranks_its_trials_and_summarises_it(tmp_path):
    """The writer ends the sweep with the last screen: children ranked (tag fxray.rank) with their
    pooled Sharpes, the experiment's saved view of them, the parent holding summary.md (artifact
    and description) and the chosen child's id; CPU sweeps do not log CUDA-only switches as params."""
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    make_sweep(storage, uri, device="cpu", base={"gamma": 0.9, "graphs": True, "matmul": "tf32", "compile": False})
    for tid, v in V.items():
        log_fold(storage, tid, 0, v)
        append_event(storage, kind="trial_end", trial_id=tid, status="FINISHED", folds_done=1)
    screen = "top 3 of 3 trials ...\nverdict: no edge: ...\n"
    pooled = {
        t: {"pooled_val_sharpe": v, "pooled_test_sharpe": -v, "pooled_test_sharpe_se": None} for t, v in V.items()
    }
    with Writer(storage) as writer:
        assert writer.wait_open(timeout=120), writer.error
        report = {"screen": screen, "ranking": ["t2", "t3", "t1"], "top": 2, "pooled": pooled, "params": ["lr"]}
        assert writer.finish("FINISHED", {"best_test_dsr": 0.1}, report=report) == 0
    children = child_runs(uri, writer.parent_id)
    assert {t: r.data.tags[links.RANK_TAG] for t, r in children.items()} == {"t2": "01", "t3": "02", "t1": "03"}
    # the last screen's numbers on each trial (an undefined one is left out, not logged as 0)
    for t, r in children.items():
        assert r.data.metrics["pooled_val_sharpe"] == V[t] and r.data.metrics["pooled_test_sharpe"] == -V[t]
        assert "pooled_test_sharpe_se" not in r.data.metrics
    # the saved view its runs URL opens: these trials, ranked, the metrics as columns
    client = MlflowClient(uri)
    view = json.loads(client.get_experiment(writer.experiment_id).tags[links.VIEW_TAG + writer.parent_id])
    state = json.loads(view["state"])
    assert state["searchFilter"] == f"tags.mlflow.parentRunId = '{writer.parent_id}'"
    assert state["orderByKey"] == f"tags.`{links.RANK_TAG}`" and state["orderByAsc"] is True
    expected = [f"tags.`{links.RANK_TAG}`", *(f"metrics.`{m}`" for m in links.VIEW_METRICS), "params.`lr`"]
    assert state["selectedColumns"] == state["columnOrder"] == expected
    assert view["name"].startswith("m: sweep ") and isinstance(view["createdAt"], int)
    assert writer.top == [(children["t2"].info.run_id, "trial-t2"), (children["t3"].info.run_id, "trial-t3")]
    assert writer.experiment_id == children["t2"].info.experiment_id
    assert children["t1"].data.params == {"lr": "0.001", "gamma": "0.9", "compile": "False"}
    parent = client.get_run(writer.parent_id)
    assert parent.data.tags["fxray.best_run_id"] == children["t2"].info.run_id
    md = (storage / "summary.md").read_text()
    assert parent.data.tags["mlflow.note.content"] == md and "verdict: no edge" in md
    assert f"/#/experiments/{writer.experiment_id}/runs/{children['t2'].info.run_id}" in md
    assert "summary.md" in {a.path for a in client.list_artifacts(writer.parent_id)}
    lines = links.next_steps(uri, writer.experiment_id, writer.parent_id, writer.top, ["fxray compare m"]).splitlines()
    assert lines[0].startswith(f"MLflow:  mlflow ui --backend-store-uri {uri}")
    assert links.runs_url(links.ui_base(uri), writer.experiment_id, writer.parent_id) in lines[1]
    assert "val Sharpe per fold, top 2" in lines[2] and children["t3"].info.run_id in lines[2]
    assert lines[-1] == "next:    fxray compare m"


# --- the progress line ---------------------------------------------------------------------------


def test_expected_folds_under_asha_by_hand():
    # 8 folds, rungs at 1, 2, 4 (and max_t 8), rf 2: fold 1 for sure, fold 2 with 1/2,
    # folds 3-4 with 1/4, folds 5-8 with 1/8
    assert expected_folds(0, 8, [1, 2, 4, 8], 2.0) == pytest.approx(1 + 0.5 + 2 * 0.25 + 4 * 0.125)
    assert expected_folds(4, 8, [1, 2, 4, 8], 2.0) == pytest.approx(4 * 0.5)  # the decision at 4 is pending
    assert expected_folds(5, 8, [1, 2, 4, 8], 2.0) == pytest.approx(3.0)  # past the last rung: all
    assert expected_folds(0, 3, None, 2.0) == 3.0  # no scheduler: every fold


class FakeTrial:
    def __init__(self, trial_id):
        from fxray.sweep.search import TRIAL_KEY

        self.config = {TRIAL_KEY: trial_id, "lr": 1e-3}  # trials are known by their fxray id


def test_the_denominator_drops_the_folds_asha_stopped():
    log = SweepLog("unused", stops=[1, 2, 4], reduction_factor=2.0)
    log.sweep = {"rounds": [{"trials": 4}], "folds": [{}] * 4}
    log.n_folds, log.same, log.planned, log.round = 4, None, 16, "r1"
    this = {"round": "r1"}
    log.records = {("a", 0): this, ("a", 1): this, ("b", 0): this, ("c", 0): this, ("old", 0): {"round": "r0"}}
    log.ended = {"b": 1, "old": 2}  # b stopped by ASHA after 1 fold; "old" is another round's
    done, total, expected = log.progress([FakeTrial(t) for t in "abc"])
    assert (done, total) == (4, 16 - 3)
    # a at 2 (rung 2 pending): folds 3-4 at 1/2; c at 1: fold 2 at 1/2, 3-4 at 1/4; one not started
    assert expected == pytest.approx(2 * 0.5 + (0.5 + 2 * 0.25) + expected_folds(0, 4, [1, 2, 4], 2.0))
