"""MLflow fed from the sweep's own log: a process that tails the run directory's
folds.jsonl and events.jsonl and writes them to the store, idempotently.

    driver:  writer = Writer(storage)             # at once: mlflow imports while Ray starts
             writer.wait_open(timeout)            # True once the parent run is open (servers)
             append_event(storage, kind="trial_end", trial_id=..., status=..., folds_done=...)
             failed = writer.finish(status, summary, artifacts)   # caught up, parent run ended
    process: python -m fxray.track.writer STORAGE SESSION      (the store: sweep.json's mlflow.uri)

The log is the truth: folds.jsonl holds every fold exactly once, in order, written by the
driver; the writer only reads it. Runs are found again by tag (fxray.Tracker), so a
writer that starts over -- a `--resume`, or one restarted after it died -- re-reads the
files from the top and writes only what the store lacks: each trial gets one child run,
each fold one point. The driver never imports mlflow. The process answers on stdout with
one JSON line per event ({"parent_run_id"}, {"error"}, {"done"}), ignores Ctrl+C (the
driver still has runs to end after one), and exits when the sweep_end event of its own
session is written or the driver closes its stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

FOLDS = "folds.jsonl"
EVENTS = "events.jsonl"
POLL_S = 0.1  # the writer's latency behind the log
# config fields that only act on CUDA (fxray.rl.trainer: CUDA graphs; TF32 matmuls): a sweep whose
# FoldWorkers ran on CPUs does not log them as params (sweep.json's base config keeps them;
# --from-run then takes their defaults, which a CPU run ignores as well)
CUDA_ONLY = ("graphs", "matmul")


def append_event(storage, **event) -> None:
    """One line of events.jsonl (the driver's only other channel to the writer)."""
    with open(Path(storage) / EVENTS, "a") as f:
        f.write(json.dumps(event) + "\n")


class Writer(contextlib.AbstractContextManager):
    """The driver's handle on the writer process (stdlib only: no mlflow here); closed at the
    end of a `with` block."""

    def __init__(self, storage, on_open=None, on_error=None, wait_for_go: bool = False):
        """`wait_for_go`: the process opens the store only after `go()` (the driver says so once
        the sweep is checked and recorded: a sweep refused after the writer started leaves the
        store untouched); else as soon as sweep.json exists."""
        self.storage, self.session = Path(storage), uuid.uuid4().hex
        self.on_open, self.on_error = on_open, on_error
        self.wait_for_go, self.went = wait_for_go, False
        self.parent_id: str | None = None
        self.experiment_id: str | None = None
        self.top: list = []  # [(run id, name)] of the best trials, once done
        self.error: str | None = None
        self.failed: int | None = None  # writes that failed, once done
        self.opened = threading.Event()  # set once open, or once it cannot be
        self.restarts = 0  # of a writer killed before it opened the store
        self._start()

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # fxray importable however the driver started
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        cmd = [sys.executable, "-m", "fxray.track.writer", str(self.storage), self.session]
        cmd += ["wait-for-go"] if self.wait_for_go and not self.went else []
        # its own session: the terminal's Ctrl+C goes to the driver, which still has runs to end
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, start_new_session=True
        )
        self.reader = threading.Thread(target=self._read, args=(self.proc,), name="fxray-mlflow-writer", daemon=True)
        self.reader.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "parent_run_id" in msg:
                self.parent_id, self.experiment_id = msg["parent_run_id"], msg.get("experiment_id")
                try:
                    if self.on_open:
                        self.on_open(self.parent_id)
                except Exception as e:  # noqa: BLE001 (e.g. sweep.json not writable: the sweep stops)
                    self._fail(last_line(e))
                self.opened.set()
            elif "error" in msg:
                self._fail(msg["error"])
            elif "done" in msg:
                self.failed, self.top = int(msg["done"]), [tuple(t) for t in msg.get("top", [])]
        if not self.opened.is_set():
            code = proc.wait()
            if code < 0 and self.error is None and self.restarts < 1:  # killed by a signal, not refused by the store
                self.restarts += 1
                self._restart(code, " before it opened the store")
                return
            self._fail(f"the MLflow writer exited before it opened the store (code {code})")

    def _restart(self, code: int, when: str = "") -> None:
        why = f"the MLflow writer had exited (code {code}){when}"
        print(f"fxray.tune: {why}; starting it again to catch up from folds.jsonl", file=sys.stderr)
        self._start()

    def _fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
            if self.on_error:
                self.on_error(error)
        self.opened.set()

    def go(self) -> None:
        """Let the process open the store (sweep.json is written)."""
        self.went = True
        if not self.proc.stdin.closed:
            with contextlib.suppress(OSError):  # it died: finish() starts it again
                self.proc.stdin.write("go\n")
                self.proc.stdin.flush()

    def wait_open(self, timeout: float | None = None) -> bool:
        """True once the store and the parent run are open; False if they cannot be."""
        self.opened.wait(timeout)
        return self.parent_id is not None and self.error is None

    def finish(
        self, status: str, summary: dict | None = None, artifacts: list | None = None, report: dict | None = None
    ) -> int:
        """Write the sweep's end, wait until the writer has caught up with the log and ended
        the parent run; returns how many writes failed. A writer that died meanwhile is
        started again (it catches up from the files). -1: the store never opened.
        `report`: what the parent's summary is made of (fxray.track.runs.Tracker.end_sweep);
        afterwards `self.top` holds the best trials' (run id, name)."""
        if self.error is not None and self.parent_id is None:
            self.close()
            return -1
        append_event(
            self.storage,
            kind="sweep_end",
            session=self.session,
            status=status,
            summary=summary or {},
            artifacts=[[d, str(p)] for d, p in artifacts or []],
            report=report or {},
        )
        if self.proc.poll() is not None and self.failed is None:
            self.opened.clear()
            self._restart(self.proc.returncode)
        self.close(600)  # it writes what the log holds, its sweep_end last, then exits
        self.reader.join(timeout=5)
        return self.failed if self.failed is not None else 1

    def close(self, timeout: float = 60) -> None:
        """Close the writer's stdin (it drains the log and exits); kill it if it hangs."""
        with contextlib.suppress(OSError):  # it died: nothing to tell it
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __exit__(self, *exc):
        self.close()


def last_line(e: BaseException) -> str:
    """The line of an error that says what is wrong (Ray and MLflow put it last; SQLAlchemy
    adds a line of its own after it, skipped)."""
    skip = ("(Background on this error", "[SQL:")
    lines = [line for line in str(e).strip().splitlines() if line.strip() and not line.startswith(skip)]
    return lines[-1] if lines else type(e).__name__


# --- the process ------------------------------------------------------------------------------


class Tail:
    """The complete lines appended to a file since the last call (a partial last line waits)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""

    def lines(self) -> list[str]:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        *done, self.partial = (self.partial + chunk).split("\n")
        return [line for line in done if line.strip()]


def say(**msg) -> None:
    """One line to the driver. A driver that is gone (kill -9) is no reason to stop: what the
    log holds is still written, then the process ends at its stdin's EOF."""
    try:
        print(json.dumps(msg), flush=True)
    except BrokenPipeError:  # Python's advice: point stdout at devnull, or the exit flush raises again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def serve(storage: str, session: str, wait: str = "") -> int:
    """Open the store once told to ("go" on stdin, with `wait`) and sweep.json exists, then write
    what the log holds until the sweep ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    storage = Path(storage)
    eof, go = threading.Event(), threading.Event()
    if not wait:
        go.set()

    def listen() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
        eof.set()

    threading.Thread(target=listen, daemon=True).start()
    from fxray.track.runs import open_sweep  # imports mlflow: seconds, while the driver starts Ray

    while not (go.is_set() and (storage / "sweep.json").exists()):  # the driver has validated everything
        if eof.is_set():
            return 0
        time.sleep(0.05)
    try:
        sweep = json.loads((storage / "sweep.json").read_text())
        tracker = open_sweep(sweep)
    except Exception as e:  # noqa: BLE001 (whatever the store says, in one line)
        say(error=last_line(e))
        return 1
    say(parent_run_id=tracker.parent_run_id, experiment_id=tracker.experiment_id)
    base, n_folds, failed, top = sweep["base"], len(sweep["folds"]), 0, []
    if sweep.get("device") == "cpu":  # switches that do nothing without CUDA are not the trial's params
        base = {k: v for k, v in base.items() if k not in CUDA_ONLY}
    folds, events, baselines = Tail(storage / FOLDS), Tail(storage / EVENTS), {}

    def write(call, *args):
        nonlocal failed
        try:
            return call(*args)
        except Exception as e:  # noqa: BLE001 (one failed write must not stop the others)
            failed += 1
            print(f"fxray.track.writer: {call.__name__} failed: {last_line(e)}", file=sys.stderr, flush=True)

    def catch_up() -> bool:
        """Everything the files hold now; True when this session's sweep_end was among it."""
        from fxray.track.records import FoldRecord, with_baselines
        from fxray.track.results import trial_label

        # events first: the driver writes a trial's folds before its end, so every fold that
        # precedes an event read now is in folds.jsonl by then (a trial ended too early
        # would drop its last folds: a finished run is never written again)
        new_events = events.lines()
        for line in folds.lines():
            rec = with_baselines(storage, json.loads(line), baselines)
            tid = rec["trial_id"]
            write(tracker.log_fold, tid, trial_label(tid), {**base, **rec["config"]}, FoldRecord.from_flat(rec))
        for line in new_events:
            ev = json.loads(line)
            if ev["kind"] == "trial_end":
                write(tracker.end_trial, ev["trial_id"], ev["folds_done"], n_folds, ev["status"], ev.get("outcome"))
            elif ev["kind"] == "sweep_end" and ev["session"] == session:
                ended = write(tracker.end_sweep, ev["status"], ev["summary"], ev["artifacts"], ev.get("report"))
                if ended:
                    top[:] = ended[0]
                    if ended[1]:
                        (storage / "summary.md").write_text(ended[1])
                return True
        return False

    while True:
        closing = eof.is_set()  # read before catching up: what the driver wrote before EOF is in
        if catch_up():
            say(done=failed, top=top)
            return 0
        if closing:
            return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(serve(*sys.argv[1:4]))
