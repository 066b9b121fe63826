"""What a person opens after a sweep: MLflow UI addresses that land on its runs, and the
parent run's summary (summary.md, also its description on the run page).

    base = ui_base(uri)                                   # http://127.0.0.1:5000 for a sqlite store
    runs_url(base, experiment_id, parent_run_id)          # the sweep's trials, best first
    metric_url(base, experiment_id, run_ids, "val_sharpe")   # a metric per fold of some runs
    run_url(base, experiment_id, run_id)

MLflow 3.17's UI opens an experiment on its GenAI traces view; `workflowType=machine_learning`
selects the runs view. Its runs page (`#/experiments/<id>/runs`) reads the search box, the
sort and the filters from the query string (searchFilter, orderByKey, orderByAsc: checked
in headless Chromium, docs/mlflow.md); the bare experiment URL redirects and drops them.
No mlflow import here: the driver prints these.
"""

from __future__ import annotations

import json
import urllib.parse


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))  # compact: shorter URLs


DEFAULT_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
RANK_TAG = "fxray.rank"  # on each child run at the end of a sweep: "01" = the trial the sweep picked


def ui_base(uri: str) -> str:
    """The UI of a tracking URI: a tracking server serves its own; a sqlite/file store is
    browsed with `mlflow ui` on 127.0.0.1:5000."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else DEFAULT_UI


def ui_command(uri: str) -> str | None:
    """The command that serves the UI of a local store (None for a tracking server)."""
    return None if uri.startswith(("http://", "https://")) else f"mlflow ui --backend-store-uri {uri}"


def _query(q: dict) -> str:
    return urllib.parse.urlencode(q, quote_via=urllib.parse.quote)


def runs_url(base: str, experiment_id: str, parent_run_id: str | None = None) -> str:
    """The runs table of an experiment in the machine-learning view; with a parent run: only
    its children (the sweep's trials, shown flat instead of collapsed under it), ranked."""
    q = {"workflowType": "machine_learning"}
    if parent_run_id:
        q.update(
            searchFilter=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            orderByKey=f"tags.`{RANK_TAG}`",
            orderByAsc="true",
        )
    return f"{base}/#/experiments/{experiment_id}/runs?" + _query(q)


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def metric_url(base: str, experiment_id: str, run_ids: list, metric: str) -> str:
    """MLflow's metric page of `run_ids` (the format of Routes.getMetricPageRoute in its UI):
    one line per run, x = step (= fold k for fxray's per-fold metrics)."""
    q = {
        "runs": _json(list(run_ids)),
        "metric": _json(metric),
        "experiments": _json([experiment_id]),
        "plot_metric_keys": _json([metric]),
        "plot_layout": "{}",
        "x_axis": "step",
        "y_axis_scale": "linear",
        "line_smoothness": "1",
        "show_point": "true",
        "deselected_curves": "[]",
        "last_linear_y_axis_range": "[]",
        "workflowType": "machine_learning",
    }
    return f"{base}/#/metric?" + _query(q)


def rank_tags(ranking: list[str]) -> dict[str, str]:
    """{trial id: "01", ...} in the order given (best first), zero-padded so that the UI's
    string sort of the tag is the rank order."""
    width = max(2, len(str(len(ranking))))
    return {tid: f"{i:0{width}d}" for i, tid in enumerate(ranking, start=1)}


def next_steps(uri: str, experiment_id: str | None, parent_run_id: str | None, top: list) -> str:
    """The lines a sweep ends with: where MLflow shows it (the last screen above has the exact
    `fxray compare` command). `top`: [(run id, run name)] of the best trials, best first."""
    base, cmd = ui_base(uri), ui_command(uri)
    lines = [f"MLflow:  {cmd}   (then open these; Ctrl+C stops it)" if cmd else f"MLflow:  {base}"]
    if experiment_id is None:
        return "\n".join(lines)
    rows = [("the trials, best first", runs_url(base, experiment_id, parent_run_id))]
    if top:
        ids = [r for r, _ in top]
        rows.append((f"val Sharpe per fold, top {len(ids)}", metric_url(base, experiment_id, ids, "val_sharpe")))
    if parent_run_id:
        rows.append(("the sweep's summary", run_url(base, experiment_id, parent_run_id)))
    width = max(len(label) for label, _ in rows) + 1
    lines += [f"  {label + ':':<{width}} {url}" for label, url in rows]
    return "\n".join(lines)


def summary_markdown(screen: str, experiment: str, experiment_id: str, parent_run_id: str, top: list) -> str:
    """summary.md of the parent run: the sweep's last screen and links (relative to the UI
    that shows it, so they work on any host and port) to its best trials."""
    lines = [f"# sweep {experiment}", "", "```", screen.strip("\n"), "```", ""]
    if top:
        best_id, best_name = top[0]
        lines += [
            f"**Best trial:** [{best_name}]({run_url('', experiment_id, best_id)}) "
            f"(tag `{RANK_TAG}` = 01 on it; the others are ranked after it).",
            "",
            f"- [the trials, best first]({runs_url('', experiment_id, parent_run_id)})",
            f"- [val Sharpe per fold of the top {len(top)}]"
            f"({metric_url('', experiment_id, [r for r, _ in top], 'val_sharpe')})",
            "",
        ]
    return "\n".join(lines)
