"""Screenshot MLflow's own views of a sweep, as a person opening the URLs the sweep printed sees them.

    python lab/mlflow_screenshot.py                                  # ./mlflow.db, its latest fxray sweep
    python lab/mlflow_screenshot.py --tracking-uri sqlite:///$PWD/mlflow.db --experiment smoke
    python lab/mlflow_screenshot.py --sweep experiments/smoke.yaml   # sweep into a temp store first

Starts `mlflow ui` on 127.0.0.1 on a free port, told by MLFLOW_PORT as a user would
(the URLs are fxray.track.links' for that address), drives headless Chromium over the
DevTools protocol (aiohttp's websocket client, a dependency of Ray), and saves, under
--out-dir (default docs/):

    mlflow_landing.png   the experiment URL with workflowType=machine_learning: the runs view
                         (not the GenAI overview MLflow 3.17 opens on), the sweep's parent
    mlflow_runs.png      the sweep's trials, ranked (fxray.track.links.runs_url: the sweep's saved
                         view), with the columns the saved view names: nothing is clicked
    mlflow_fold_chart.png  val Sharpe per fold (step = fold k) of the top trials (metric_url)
    mlflow_summary.png   the parent run's page: its description is the sweep's last screen

Each page is checked in the rendered DOM (the runs and the metric it must show) before its
shot. MLflow opens its Assistant side panel by itself on a browser's first visit from
localhost (a quarter of the screen; it remembers the close): it is closed before each shot.
Needs Debian's chromium: `apt-get update && apt-get install -y chromium`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fxray.track.links import RANK_TAG, VIEW_METRICS, metric_url, run_url, runs_url, ui_base  # noqa: E402

MAX_BYTES = 300_000  # keep each committed PNG small
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]


def pick_sweep(uri: str, experiment: str | None, top: int) -> tuple[str, str, str, list]:
    """(experiment id, parent run id, its name, [(run id, name)]) of the latest sweep's `top` trials, by the
    rank the sweep gave them (tag fxray.rank), else by mean val Sharpe (sweeps before the tag)."""
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
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]

    def key(r):
        rank = r.data.tags.get(RANK_TAG)
        return (0, rank) if rank else (1, -r.data.metrics.get("mean_val_sharpe", float("-inf")))

    children.sort(key=key)
    top_runs = [(r.info.run_id, r.info.run_name) for r in children[:top]]
    return parent.info.experiment_id, parent.info.run_id, parent.info.run_name, top_runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(uri: str, port: int, log) -> subprocess.Popen:
    """`mlflow ui` on 127.0.0.1:`port` (MLFLOW_PORT) in its own process group; returns once
    /health answers."""
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--workers", "1"]
    env = {**os.environ, "MLFLOW_PORT": str(port)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.time() + 120
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
    sys.exit(f"mlflow_screenshot: error: mlflow ui did not answer on 127.0.0.1:{port} in 120 s")


def stop(proc: subprocess.Popen) -> None:
    """End a process we started, and its group (mlflow ui runs uvicorn as a child)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# --- Chromium over the DevTools protocol ---------------------------------------------------


class Page:
    """One tab: `await page("Domain.method", **params)` -> its result; events are skipped."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    async def __call__(self, method: str, **params):
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=60)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expression: str):
        out = await self("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return out.get("result", {}).get("value")

    async def wait_text(self, needles: list[str], timeout: float = 60) -> None:
        """Until the page's text holds every needle (the SPA renders after its API calls)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = await self.js("document.body ? document.body.innerText : ''") or ""
            missing = [n for n in needles if n not in text]
            if not missing:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"the page does not show {', '.join(missing)}")

    async def close_assistant(self) -> None:
        await self.js(
            "(() => { const b = document.querySelector("
            "'[data-component-id=\"mlflow.assistant.chat_panel.close\"]'); if (b) b.click(); })()"
        )

    async def click_text(self, selector: str, text: str) -> bool:
        """Click the first `selector` element whose text is exactly `text`."""
        return bool(
            await self.js(
                f"(() => {{ for (const e of document.querySelectorAll({json.dumps(selector)})) "
                f"if (e.innerText && e.innerText.trim() === {json.dumps(text)}) {{ e.click(); return true; }} "
                "return false; })()"
            )
        )

    async def shot(self, path: Path) -> None:
        data = await self("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(data["data"]))


async def take(shots: list[dict], profile: Path, size: tuple[int, int]) -> list[str]:
    """Open each shot's URL in one headless Chromium tab and save its PNG; returns notes."""
    import aiohttp

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        sys.exit("mlflow_screenshot: error: no chromium (apt-get update && apt-get install -y chromium)")
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    notes = []
    try:
        active = profile / "DevToolsActivePort"
        for _ in range(200):
            if active.exists() and active.read_text().strip():
                break
            time.sleep(0.1)
        port = int(active.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json") as r:
                targets = await r.json(content_type=None)
            ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                page = Page(ws)
                await page("Page.enable")
                await page(
                    "Emulation.setDeviceMetricsOverride",
                    width=size[0],
                    height=size[1],
                    deviceScaleFactor=1,
                    mobile=False,
                )
                for s in shots:
                    await page("Page.navigate", url=s["url"])
                    await page.wait_text(s["needles"])
                    await asyncio.sleep(2.0)  # charts and tables settle after their data
                    await page.close_assistant()
                    for text in s.get("click", ()):  # e.g. the description's "Show more"
                        await page.click_text("button, a, span", text)
                        await asyncio.sleep(1.0)
                    await asyncio.sleep(1.5)
                    await page.shot(s["out"])
                    shrink(s["out"])
                    notes.append(f"wrote {s['out']} ({s['out'].stat().st_size / 1000:.0f} kB): {s['what']}")
    finally:
        stop(proc)
    return notes


def shrink(path: Path) -> None:
    """A 128-colour palette PNG if the screenshot is over MAX_BYTES (UI screenshots have few colours)."""
    if path.stat().st_size > MAX_BYTES:
        from PIL import Image

        Image.open(path).convert("RGB").quantize(128).save(path, optimize=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tracking-uri", metavar="URI", help="sqlite store (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)"
    )
    p.add_argument("--experiment", metavar="NAME", help="MLflow experiment (default: the one with the latest sweep)")
    p.add_argument("--sweep", metavar="YAML", help="first run `fxray tune --experiment YAML` into a temp store")
    p.add_argument("--top", type=int, default=5, metavar="N", help="trials on the per-fold chart, ranked")
    p.add_argument("--metric", default="val_sharpe", metavar="NAME", help="the per-fold metric to chart")
    p.add_argument("--out-dir", default="docs", metavar="DIR", help="where the PNGs go (default docs/)")
    p.add_argument("--size", default="1600x1000", metavar="WxH", help="browser window in pixels")
    args = p.parse_args(argv)
    out = Path(args.out_dir).absolute()
    size = tuple(int(v) for v in args.size.lower().split("x"))
    with tempfile.TemporaryDirectory(prefix="fxray-shot-") as tmp:
        tmp = Path(tmp)
        uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
        if args.sweep:
            uri = f"sqlite:///{tmp / 'mlflow.db'}"
            cmd = [sys.executable, "-m", "fxray.tune", "--experiment", str(Path(args.sweep).absolute())]
            subprocess.run([*cmd, "--storage", str(tmp / "run"), "--tracking-uri", uri], cwd=tmp, check=True)
        if not uri.startswith("sqlite:///") or not Path(uri[len("sqlite:///") :]).is_file():
            sys.exit(f"mlflow_screenshot: error: {uri}: not an existing sqlite store")
        eid, parent_id, parent_name, top = pick_sweep(uri, args.experiment, args.top)
        names, ids = [n for _, n in top], [r for r, _ in top]
        port = free_port()
        base = ui_base(uri, {"MLFLOW_PORT": str(port)})
        out.mkdir(parents=True, exist_ok=True)
        shots = [
            {
                "url": f"{base}/#/experiments/{eid}?workflowType=machine_learning",
                "needles": [parent_name, "matching runs"],
                "out": out / "mlflow_landing.png",
                "what": "the experiment in MLflow's machine-learning view",
            },
            {
                "url": runs_url(base, eid, parent_id),
                "needles": [*names[:3], *VIEW_METRICS, RANK_TAG],
                "out": out / "mlflow_runs.png",
                "what": "the sweep's trials, ranked, in its saved view",
            },
            {
                "url": metric_url(base, eid, ids, args.metric),
                "needles": [args.metric, *names],
                "out": out / "mlflow_fold_chart.png",
                "what": f"{args.metric} per fold of the top {len(ids)}",
            },
            {
                "url": run_url(base, eid, parent_id),
                "needles": ["best_test_sharpe", "verdict"],
                "click": ["Show more"],
                "out": out / "mlflow_summary.png",
                "what": "the sweep's parent run: its summary and verdict metrics",
            },
        ]
        with open(tmp / "mlflow-ui.log", "w") as log:
            proc = start_ui(uri, port, log)
            try:
                print(f"sweep run {parent_id}: top {', '.join(names)}")
                notes = asyncio.run(take(shots, tmp / "profile", size))
            finally:
                stop(proc)
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
