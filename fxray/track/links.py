"""What a person opens after a sweep: MLflow UI addresses that land on its runs, the saved view
that shows its trials with their key metrics as columns, and the parent run's summary
(summary.md, also its description on the run page).

    base = ui_base(uri)                                   # where the UI of this store is served
    runs_url(base, experiment_id, parent_run_id)          # the sweep's trials, ranked (its saved view)
    metric_url(base, experiment_id, run_ids, "val_sharpe")   # a metric per fold of some runs
    run_url(base, experiment_id, run_id)

MLflow 3.17's UI opens an experiment on its GenAI overview; `workflowType=machine_learning`
selects the runs view. Its runs table shows no metric column until a user ticks one, and keeps
that choice in the browser; the one thing on the server that sets the columns, the filter and the
sort is a saved view: the experiment tag `mlflow.sharedViewState.<key>` (MLflow's "Views" menu
lists it), opened by `#/experiments/<id>/runs?viewStateShareKey=<key>`. Each sweep writes one,
keyed by its parent run id (`saved_view`). Checked in headless Chromium (docs/mlflow.md).
No mlflow import here: the driver prints these.
"""

from __future__ import annotations

import json
import os
import urllib.parse


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))  # compact: shorter URLs


RANK_TAG = "fxray.rank"  # on each child run at the end of a sweep: "01" = the chosen trial
VIEW_TAG = "mlflow.sharedViewState."  # + key: an experiment's saved view of its runs page (MLflow 3.x)
# the trials table's columns, in order: the last screen's (fxray.track.report.print_last_screen)
VIEW_METRICS = ("score", "pooled_val_sharpe", "pooled_test_sharpe", "pooled_test_sharpe_se", "folds_done")


def ui_base(uri: str, env=os.environ) -> str:
    """The UI of a tracking URI. A tracking server (http/https) serves its own. A sqlite or file
    store is browsed with `mlflow ui`, which listens where MLflow's own variables say:
    MLFLOW_HOST (default 127.0.0.1; a bind-all 0.0.0.0 is opened as 127.0.0.1), MLFLOW_PORT
    (default 5000), MLFLOW_STATIC_PREFIX (default none)."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    host = env.get("MLFLOW_HOST") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
    return f"http://{host}:{env.get('MLFLOW_PORT') or 5000}{env.get('MLFLOW_STATIC_PREFIX') or ''}"


def ui_command(uri: str, env=os.environ) -> str | None:
    """The command that serves the UI of a local store at ui_base (None for a tracking server):
    MLflow's variables spelled out as flags, so that it serves there from any shell."""
    if uri.startswith(("http://", "https://")):
        return None
    flags = [("--host", "MLFLOW_HOST"), ("--port", "MLFLOW_PORT"), ("--static-prefix", "MLFLOW_STATIC_PREFIX")]
    return f"mlflow ui --backend-store-uri {uri}" + "".join(f" {f} {env[v]}" for f, v in flags if env.get(v))


def _query(q: dict) -> str:
    return urllib.parse.urlencode(q, quote_via=urllib.parse.quote)


def saved_view(parent_run_id: str, name: str, params: list, now_ms: int) -> tuple[str, str]:
    """(experiment tag key, value) of the sweep's saved view: its trials (the parent's children,
    flat), ranked by RANK_TAG, with the last screen's columns: rank, VIEW_METRICS, the searched
    `params`. The value is MLflow's envelope {name, createdAt, updatedAt, state: JSON text}."""
    columns = [f"tags.`{RANK_TAG}`", *(f"metrics.`{m}`" for m in VIEW_METRICS), *(f"params.`{p}`" for p in params)]
    state = {
        "searchFilter": f"tags.mlflow.parentRunId = '{parent_run_id}'",
        "orderByKey": f"tags.`{RANK_TAG}`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": {c: max(90, 7 * len(c.split("`")[1]) + 24) for c in columns},  # px: each name whole
    }
    envelope = {"name": name, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(state)}
    return VIEW_TAG + parent_run_id, json.dumps(envelope)


def runs_url(base: str, experiment_id: str, parent_run_id: str) -> str:
    """The sweep's saved view (`saved_view`): its trials, ranked, with their key metrics."""
    q = {"viewStateShareKey": parent_run_id, "workflowType": "machine_learning"}
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
    """{trial id: "01", ...} in the order given (the chosen trial first), zero-padded so that the
    UI's string sort of the tag is the rank order."""
    width = max(2, len(str(len(ranking))))
    return {tid: f"{i:0{width}d}" for i, tid in enumerate(ranking, start=1)}


def next_steps(
    uri: str, experiment_id: str | None, parent_run_id: str | None, top: list, commands: list | None = None
) -> str:
    """The lines a sweep ends with: where MLflow shows it, then the `commands` to run next.
    `top`: [(run id, run name)] of the top trials, ranked (the chosen trial first)."""
    base, cmd = ui_base(uri), ui_command(uri)
    lines = [f"MLflow:  {cmd}   (then open these; Ctrl+C stops it)" if cmd else f"MLflow:  {base}"]
    rows = []
    if experiment_id is not None and parent_run_id:
        rows.append(("the trials, ranked", runs_url(base, experiment_id, parent_run_id)))
    if experiment_id is not None and top:
        ids = [r for r, _ in top]
        rows.append((f"val Sharpe per fold, top {len(ids)}", metric_url(base, experiment_id, ids, "val_sharpe")))
    if experiment_id is not None and parent_run_id:
        rows.append(("the sweep's summary", run_url(base, experiment_id, parent_run_id)))
    width = max((len(label) for label, _ in rows), default=0) + 1
    lines += [f"  {label + ':':<{width}} {url}" for label, url in rows]
    lines += [f"{'next:' if i == 0 else '':<8} {c}" for i, c in enumerate(commands or [])]
    return "\n".join(lines)


def summary_markdown(screen: str, experiment: str, experiment_id: str, parent_run_id: str, top: list) -> str:
    """summary.md of the parent run: the sweep's last screen and links (relative to the UI
    that shows it, so they work on any host and port) to its trials."""
    lines = [f"# sweep {experiment}", "", "```", screen.strip("\n"), "```", ""]
    if top:
        chosen_id, chosen_name = top[0]
        lines += [
            f"**Chosen trial:** [{chosen_name}]({run_url('', experiment_id, chosen_id)}) "
            f"(tag `{RANK_TAG}` = 01 on it; the others are ranked after it).",
            "",
            f"- [the trials, ranked]({runs_url('', experiment_id, parent_run_id)})",
            f"- [val Sharpe per fold of the top {len(top)}]"
            f"({metric_url('', experiment_id, [r for r, _ in top], 'val_sharpe')})",
            "",
        ]
    return "\n".join(lines)
