"""Screenshot MLflow's own view of a sweep: its child runs' val_sharpe per fold (step = fold).

    python scripts/mlflow_screenshot.py                                  # ./mlflow.db, its latest fxray sweep
    python scripts/mlflow_screenshot.py --tracking-uri sqlite:///$PWD/mlflow.db --experiment smoke
    python scripts/mlflow_screenshot.py --sweep experiments/smoke.yaml   # sweep into a temp store first

Starts `mlflow ui` on 127.0.0.1 (a free port) over the sqlite store, opens the metric page
of the sweep's best child runs (the page MLflow's compare view links to, x axis = step) in
headless Chromium, checks in the rendered DOM that every chosen run and the metric are on
the page, saves the PNG (default docs/mlflow_compare.png), and stops the server.
Needs Debian's chromium: `apt-get update && apt-get install -y chromium`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

MAX_BYTES = 500_000  # keep the committed PNG small
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
    "--virtual-time-budget=30000",
]


def pick_runs(uri: str, experiment: str | None, top: int) -> tuple[str, str, list]:
    """(experiment id, parent run id, [(run id, name)]) of the latest sweep's `top` trials by mean val Sharpe."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exps = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
    if exps == [None]:
        sys.exit(f"mlflow_screenshot: error: experiment {experiment!r} not found in {uri}")
    runs = client.search_runs([e.experiment_id for e in exps], "tags.`fxray.folds` != ''")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not parents:
        sys.exit(f"mlflow_screenshot: error: no fxray sweep in {uri}")
    parent = max(parents, key=lambda r: r.info.start_time)
    scored = []
    for r in runs:
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id:
            vals = [m.value for m in client.get_metric_history(r.info.run_id, "val_sharpe")]
            if vals:
                scored.append((sum(vals) / len(vals), r.info.run_id, r.info.run_name))
    scored.sort(reverse=True)
    return parent.info.experiment_id, parent.info.run_id, [(rid, name) for _, rid, name in scored[:top]]


def metric_page(base: str, experiment_id: str, run_ids: list, metric: str) -> str:
    """MLflow's metric page URL (the format of Routes.getMetricPageRoute in its UI)."""
    q = {
        "runs": json.dumps(run_ids),
        "metric": json.dumps(metric),
        "experiments": json.dumps([experiment_id]),
        "plot_metric_keys": json.dumps([metric]),
        "plot_layout": "{}",
        "x_axis": "step",
        "y_axis_scale": "linear",
        "line_smoothness": "1",
        "show_point": "true",
        "deselected_curves": "[]",
        "last_linear_y_axis_range": "[]",
    }
    return f"{base}/#/metric?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(uri: str, port: int, log) -> subprocess.Popen:
    """`mlflow ui` bound to 127.0.0.1 in its own process group; returns once /health answers."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"mlflow_screenshot: error: mlflow ui exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop(proc)
    sys.exit(f"mlflow_screenshot: error: mlflow ui did not answer on 127.0.0.1:{port} in 90 s")


def stop(proc: subprocess.Popen) -> None:
    """End the server we started: its process group (mlflow ui runs uvicorn as a child)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def chromium(args: list, profile: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        sys.exit("mlflow_screenshot: error: no chromium (apt-get update && apt-get install -y chromium)")
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180
    )


def shrink(path: Path) -> None:
    """A 256-colour palette PNG if the screenshot is over MAX_BYTES (UI screenshots have few colours)."""
    if path.stat().st_size > MAX_BYTES:
        from PIL import Image

        Image.open(path).convert("RGB").quantize(256).save(path, optimize=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracking-uri", help="sqlite store (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--experiment", help="MLflow experiment (default: the one with the latest fxray sweep)")
    p.add_argument("--sweep", help="first run `python -m fxray.tune --experiment FILE` into a temp store")
    p.add_argument("--top", type=int, default=8, help="child runs to plot, best mean val Sharpe first")
    p.add_argument("--metric", default="val_sharpe")
    p.add_argument("--out", default="docs/mlflow_compare.png")
    args = p.parse_args(argv)
    out = Path(args.out).absolute()
    with tempfile.TemporaryDirectory(prefix="fxray-shot-") as tmp:
        tmp = Path(tmp)
        uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
        if args.sweep:
            uri = f"sqlite:///{tmp / 'mlflow.db'}"
            env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "fxray.tune",
                    "--experiment",
                    str(Path(args.sweep).absolute()),
                    "--storage",
                    str(tmp / "run"),
                ],
                env=env,
                cwd=tmp,
                check=True,
            )
        if not uri.startswith("sqlite:///") or not Path(uri[len("sqlite:///") :]).is_file():
            sys.exit(f"mlflow_screenshot: error: {uri}: not an existing sqlite store")
        experiment_id, parent_id, runs = pick_runs(uri, args.experiment, args.top)
        port = free_port()
        with open(tmp / "mlflow-ui.log", "w") as log:
            proc = start_ui(uri, port, log)
            try:
                url = metric_page(f"http://127.0.0.1:{port}", experiment_id, [r for r, _ in runs], args.metric)
                print(f"sweep run {parent_id}: {len(runs)} child runs; {url}")
                dom = chromium(["--dump-dom", url], tmp / "profile-dom").stdout
                missing = [name for _, name in runs if name not in dom] + (
                    [args.metric] if args.metric not in dom else []
                )
                if missing:
                    sys.exit(f"mlflow_screenshot: error: the page does not show {', '.join(missing)}")
                out.parent.mkdir(parents=True, exist_ok=True)
                shot = chromium([f"--screenshot={out}", url], tmp / "profile-shot")
                if not out.exists():
                    sys.exit(f"mlflow_screenshot: error: chromium wrote no screenshot: {shot.stderr[-500:]}")
            finally:
                stop(proc)
    shrink(out)
    print(
        f"wrote {out} ({out.stat().st_size / 1000:.0f} kB): {', '.join(n for _, n in runs)} by {args.metric} per fold"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
