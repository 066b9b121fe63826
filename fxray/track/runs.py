"""The sweep's MLflow runs: a parent run per sweep, a child run per trial, a metric
step per fold (`Tracker`). It runs in the writer process (fxray.track.writer), which
feeds it from the run directory's log; the driver never imports mlflow.

    tracker = open_sweep(sweep)            # the parent run of sweep.json (found by tag, or created)
    tracker.log_fold(trial_id, name, params, record)   # a FoldRecord; a fold logged already is skipped
    tracker.end_trial(trial_id, folds_done, n_folds)
    tracker.end_sweep(status, summary, artifacts)

    experiment (from the experiment file's `name`)
      parent run "sweep <name>"     tags: dataset hash, experiment, git commit, fold ranges, sweep id
        |                           artifacts: experiment.yaml (at its creation), folds.csv, equity.png,
        |                           best_checkpoint/
        +- child run per trial      tag mlflow.parentRunId, fxray.trial_id; params: the full config
                                    metrics per fold (step = fold k): FoldRecord.mlflow_metrics()
                                    summary: the last points of mean_val_sharpe / mean_test_sharpe
                                    (running means), folds_done, tag fxray.stopped_early
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

RETURNS_DIR = "fold_returns"  # child-run artifacts fold<k>.json: fold_returns(record)
# fold_returns' keys of FoldRecord's fields (fxray.compare reads them back)
RETURNS_FIELDS = {"val": "val_periods", "test": "test_periods", "baselines": "baseline_periods"}
STEP_METRIC = "fold_time_s"  # a metric every logged fold has: which folds a child run holds

# mlflow (1-3 s to import) is bound here by Tracker(): the driver imports this module for
# tracking_uri() and check_uri(), and must not pay for mlflow itself
Metric = Param = RunTag = MlflowClient = None


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else an ABSOLUTE sqlite file in the cwd (Tune moves trials' cwd)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def open_store(uri: str | None):
    """(MlflowClient, uri) of the existing store at `uri` (None: tracking_uri()), checked before
    MLflow retries (check_uri): a ValueError in one line naming --tracking-uri, never a new empty store."""
    from mlflow.tracking import MlflowClient as Client

    uri = uri or tracking_uri()
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise ValueError(f"--tracking-uri {uri}: no such sqlite file (run python -m fxray.tune first)")
    check_uri(uri, "--tracking-uri")  # a scheme MLflow knows, an SQLite file, a server that answers
    if uri.startswith("file:") and not Path(uri.split("://", 1)[-1]).is_dir():
        raise ValueError(f"--tracking-uri {uri}: no such MLflow file store")
    return Client(uri), uri


def trial_run(run_id: str, uri: str | None, needs: tuple[str, ...], label: str):
    """(client, run, uri) of an fxray sweep's trial run in the store at `uri` (open_store)
    carrying the tags `needs`; a ValueError in one line, prefixed by `label` (the flag or
    argument that named the run), when the store, the run or a tag is missing."""
    from mlflow.exceptions import MlflowException

    client, uri = open_store(uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ValueError(f"{label}: no such run in {uri}") from None
    missing = [t for t in ("mlflow.parentRunId", *needs) if t not in run.data.tags]
    if missing:
        raise ValueError(f"{label}: not an fxray sweep trial run (no tag {', '.join(missing)})")
    return client, run, uri


def search_all(client, experiment_ids: list, query: str = "") -> list:
    """Every run of `experiment_ids` that `query` selects (MLflow's search, page after page)."""
    runs, page = [], None
    while page is None or page.token:
        page = client.search_runs(experiment_ids, query, max_results=1000, page_token=page and page.token)
        runs += page
    return runs


def git_commit() -> str | None:
    cmd, here = ["git", "rev-parse", "HEAD"], Path(__file__).resolve().parent
    try:  # check: outside a repository rev-parse fails (CalledProcessError, a SubprocessError)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, cwd=here, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def create_sqlite_store(db: Path) -> None:
    """A sqlite store that does not exist yet, made whole or not at all: MLflow creates its
    tables one migration at a time, and a writer killed in between leaves a file no later open
    accepts (the sweep restarts a killed writer). The tables are made in a file of this
    process's own, which is then linked into place only if no other process made the store
    first."""
    from mlflow.tracking import MlflowClient

    part = db.with_name(f".{db.name}.{os.getpid()}.part")
    part.unlink(missing_ok=True)
    try:
        MlflowClient(f"sqlite:///{part}").search_experiments(max_results=1)
        try:
            os.link(part, db)
        except FileExistsError:
            pass  # another sweep's writer made it meanwhile: theirs is the store
    finally:
        part.unlink(missing_ok=True)


SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "file", "http", "https", "databricks")


def check_uri(uri: str, label: str = "MLFLOW_TRACKING_URI", timeout: float = 5.0) -> None:
    """The store is checked before anything starts (ValueError, one line, `label` naming where
    `uri` came from): a known scheme; a sqlite file that is an SQLite database (or none yet) in a
    writable folder; a tracking server that answers. Other databases are checked when the
    writer opens them."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else "file"
    if scheme not in SCHEMES:
        raise ValueError(
            f"{label} {uri}: {scheme!r} is not a store MLflow opens ({', '.join(SCHEMES)}); "
            "e.g. sqlite:////abs/path/mlflow.db or http://127.0.0.1:5000"
        )
    if scheme == "sqlite" and not uri.startswith("sqlite:///"):
        raise ValueError(f"{label} {uri}: names no file; write sqlite:///relative.db or sqlite:////abs.db")
    if scheme == "file":  # a local folder (mlflow makes it, not its parents)
        folder = Path(uri.split("://", 1)[-1])
        if not folder.is_dir() and not folder.absolute().parent.is_dir():
            raise ValueError(f"{label} {uri}: {folder.absolute().parent} is not a folder")
    path = sqlite_path(uri)
    if path is not None:
        if not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
            raise ValueError(
                f"{label} {uri}: {path.parent} is not a writable folder; "
                "point it at a writable path (or unset it for ./mlflow.db)"
            )
        if path.exists() and (not path.is_file() or _head(path) not in (b"", b"SQLite format 3\x00")):
            raise ValueError(
                f"{label} {uri}: {path} is not an SQLite database; point it at an MLflow store or a new file"
            )
    elif scheme in ("http", "https"):  # MLflow would retry for minutes: one quick look instead
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # something answers: the writer finds out whether it is MLflow
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise ValueError(
                f"{label} {uri}: no tracking server answers there ({reason}); "
                "start it (mlflow server --host 127.0.0.1) or unset it for ./mlflow.db"
            ) from None


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(16)


class Tracker:
    """The sweep's parent run and its children, looked up by tag (idempotent on resume)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        parent_run_id: str | None = None,
        sweep_tags: dict | None = None,
        run_name: str | None = None,
        sweep_id: str | None = None,
        experiment_file: str | None = None,
    ):
        """`experiment_file` (the run directory's copy, its base: chain resolved: fxray.sweep.rundir):
        logged to a parent run created here as experiment.yaml (fxray compare reads the search space
        from it)."""
        global Metric, Param, RunTag, MlflowClient
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        db = sqlite_path(uri)
        if db is not None and not db.exists():
            create_sqlite_store(db)
        self.client = MlflowClient(uri)
        self.experiment_name = experiment
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:  # artifacts beside the db, not in whatever cwd we are in
            artifacts = (db.parent / "mlartifacts" / experiment).as_uri() if db else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        else:
            self.experiment_id = exp.experiment_id
        if parent_run_id is None and sweep_id is not None:  # created by a writer that died before the
            # driver recorded its id in sweep.json: found again by the sweep's id
            found = self.client.search_runs(
                [self.experiment_id], f"tags.`fxray.sweep_id` = '{sweep_id}'", max_results=1
            )
            parent_run_id = found[0].info.run_id if found else None
        if parent_run_id is None:
            tags = {**(sweep_tags or {}), **({"fxray.sweep_id": sweep_id} if sweep_id else {})}
            run = self.client.create_run(self.experiment_id, tags=tags, run_name=run_name)
            parent_run_id = run.info.run_id
            if experiment_file:
                self.client.log_text(parent_run_id, Path(experiment_file).read_text(), "experiment.yaml")
        else:
            self.client.update_run(parent_run_id, status="RUNNING")
        self.parent_run_id = parent_run_id
        self.sweep_tags = sweep_tags or {}
        self.trial_tags: dict = {}  # child runs only, set by open_sweep (the round's seed, the data file)
        self.children: dict[str, str] = {}  # trial id -> run id
        self.finished: set[str] = set()  # trial ids whose run is FINISHED: never touched again
        self.steps: dict[str, set] = {}  # run id -> folds already logged
        self.without_params: set[str] = set()  # trial ids whose run was created, its params not logged
        for run in search_all(self.client, [self.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'"):
            tid = run.data.tags.get("fxray.trial_id")
            self.children[tid] = run.info.run_id
            if not run.data.params:  # a writer killed between create_run and its params
                self.without_params.add(tid)
            if run.info.status == "FINISHED":
                self.finished.add(tid)
            elif run.info.status != "RUNNING":  # a FAILED trial that --resume retries: same run
                self.client.update_run(run.info.run_id, status="RUNNING")

    def _child(self, trial_id: str, name: str, params: dict) -> str:
        if trial_id not in self.children:
            tags = {**self.sweep_tags, **self.trial_tags, "mlflow.parentRunId": self.parent_run_id}
            tags["fxray.trial_id"] = trial_id
            self.children[trial_id] = self.client.create_run(self.experiment_id, tags=tags, run_name=name).info.run_id
            self.without_params.add(trial_id)
        if trial_id in self.without_params:  # a new run, or one a killed writer left without them
            params = [Param(k, str(v)) for k, v in sorted(params.items())]
            self.client.log_batch(self.children[trial_id], params=params)
            self.without_params.discard(trial_id)
        return self.children[trial_id]

    def log_fold(self, trial_id: str, name: str, params: dict, record) -> None:
        """One fold of one trial, step = fold k; a fold already logged (a resumed trial) is skipped."""
        if trial_id in self.finished:
            return
        run_id = self._child(trial_id, name, params)
        if run_id not in self.steps:  # fold_time_s: logged for every fold (a Sharpe is not, if undefined)
            hist = self.client.get_metric_history(run_id, STEP_METRIC)
            self.steps[run_id] = {m.step for m in hist}
        step = int(record.fold)
        if step in self.steps[run_id]:
            return
        # the windows' hourly returns, the references' too: what fxray.compare pools; before the
        # metrics: a crash in between re-logs the fold on resume (this file is overwritten)
        self.client.log_dict(run_id, fold_returns(record), f"{RETURNS_DIR}/fold{step}.json")
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in record.mlflow_metrics().items()]
        # a diverged fold marks its run at once (its metrics are left out, never logged as 0)
        tags = [RunTag("fxray.status", "diverged")] if record.status == "diverged" else []
        self.client.log_batch(run_id, metrics=metrics, tags=tags)
        self.steps[run_id].add(step)

    def end_trial(
        self, trial_id: str, folds_done: int, n_folds: int, status: str = "FINISHED", outcome: str | None = None
    ) -> None:
        """End a child run. Its summary is the last point of mean_val_sharpe / mean_test_sharpe
        (the running means, logged per fold); folds_done < n_folds means ASHA stopped it (or it
        diverged: tag fxray.status "diverged", else "ok")."""
        if trial_id in self.finished or trial_id not in self.children:
            return
        run_id = self.children[trial_id]
        last = Metric("folds_done", folds_done, int(time.time() * 1000), max(folds_done - 1, 0))
        tags = [RunTag("fxray.stopped_early", str(folds_done < n_folds and outcome != "diverged").lower())]
        if outcome is not None:
            tags.append(RunTag("fxray.status", outcome))
        self.client.log_batch(run_id, metrics=[last], tags=tags)
        self.client.set_terminated(run_id, status)
        if status == "FINISHED":
            self.finished.add(trial_id)

    def end_sweep(
        self, status: str, summary: dict | None = None, artifacts: list | None = None, report: dict | None = None
    ) -> tuple[list, str | None]:
        """Summary metrics and artifacts [(dir in the run or None, local file)] on the parent; end it.

        `report` {"screen": the last screen's text, "ranking": trial ids ranked, "top": N,
        "pooled": {trial id: {metric: value}}, "params": the searched names}: each child gets its
        rank (tag fxray.rank, "01" = the chosen trial) and its pooled Sharpes (the last screen's),
        the parent the chosen child's run id (tag fxray.best_run_id) and summary.md (artifact, and
        its description on the run page), the experiment the sweep's saved view (links.saved_view).
        Returns ([(run id, name)] of the top N, summary.md's text)."""
        from fxray.track.links import RANK_TAG, rank_tags, saved_view, summary_markdown
        from fxray.track.results import trial_label

        run_id, top, md, now = self.parent_run_id, [], None, int(time.time() * 1000)
        if summary:
            self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in summary.items()])
        if report:
            ranking = [tid for tid in report.get("ranking", []) if tid in self.children]
            pooled = report.get("pooled", {})
            for tid, rank in rank_tags(ranking).items():
                metrics = [Metric(k, float(v), now, 0) for k, v in pooled.get(tid, {}).items() if v is not None]
                self.client.log_batch(self.children[tid], metrics=metrics, tags=[RunTag(RANK_TAG, rank)])
            name = f"{self.experiment_name}: sweep {run_id[:8]}, trials ranked"
            self.client.set_experiment_tag(self.experiment_id, *saved_view(run_id, name, report.get("params", []), now))
            top = [(self.children[tid], trial_label(tid)) for tid in ranking[: report.get("top", 5)]]
            if top:
                self.client.set_tag(run_id, "fxray.best_run_id", top[0][0])
            md = summary_markdown(report.get("screen", ""), self.experiment_name, self.experiment_id, run_id, top)
            self.client.log_text(run_id, md, "summary.md")
            self.client.set_tag(run_id, "mlflow.note.content", md)  # the run page's description
        for dest, local in artifacts or []:
            if Path(local).exists():
                self.client.log_artifact(run_id, str(local), artifact_path=dest)
        self.client.set_terminated(run_id, status)
        return top, md


def open_sweep(sweep: dict) -> Tracker:
    """The Tracker of a sweep described by its sweep.json (parent run created on first use)."""
    m = sweep["mlflow"]
    name = m.get("run_name") or f"sweep {sweep['experiment']}"
    file = sweep.get("experiment_file")
    tracker = Tracker(m["uri"], m["experiment"], m.get("parent_run_id"), m.get("tags"), name, sweep.get("id"), file)
    # what `python -m fxray.train --from-run` needs to retrain a trial: its round's training
    # seed (an extension round may have another) and the data file the sweep read
    tracker.trial_tags = {"fxray.seed": str(sweep["rounds"][-1]["seed"]), "fxray.data_path": sweep["data"]["path"]}
    return tracker


def fold_returns(record) -> dict:
    """A fold's returns as a child run's artifact: the hourly returns of its val and test
    windows and the references' on them."""
    return {
        "fold": record.fold,
        "status": record.status,
        **{key: getattr(record, name) for key, name in RETURNS_FIELDS.items()},
    }
