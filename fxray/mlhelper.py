"""The sweep's MLflow client (fxray.mlruns.Tracker), kept in a helper process that the
driver starts first.

    store = TrackerProcess(uri, study_db)  # at once: it imports mlflow and readies the stores
    store.ready_study()                    # the Optuna study file it readied, moved into place
    tracker = OpeningTracker(store, sweep, on_open)  # opens the sweep in a thread; calls queue
    tracker.log_fold(trial_id, ...)        # queued there, in order: the driver does not wait
    tracker.end_sweep(status, ...)         # waits for what is queued
    store.close()

Why a process: importing mlflow and creating a new sqlite store's tables take ~5 s
on the GPU machines. Done in the driver they delayed Tune's start by that much;
done in a thread of the driver they starved Tune's event loop of the GIL (the
first trial started 8.4 s after Tune instead of 3.5 s, measured). In a process of
its own that work runs while Ray starts, and costs the driver nothing; so do the
per-fold writes (QueuedTracker). It is still one process writing the store, in
the order the driver's Tune callbacks asked. Tune does not wait for the store
either: OpeningTracker connects in a thread of the driver (it only waits on the
helper) and replays what was logged meanwhile, so a store slower to ready than
Ray is to start (2.3 s after the workers were created, on a cold GPU machine) no
longer delays the first trial.

A new sqlite store is readied in a file beside the target and moved into place
only when the sweep opens it, so a sweep that fails to start leaves no mlflow.db;
the same for a new sweep's Optuna study file (~1 s of table creation saved),
readied first and moved in by ready_study before Tune opens it.
The helper runs in its own session and ignores SIGINT (after a Ctrl+C the driver
still has runs to end), and exits when the driver closes its stdin or dies.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from multiprocessing.managers import BaseManager
from pathlib import Path

from fxray.mlruns import Tracker, open_sweep, sqlite_path


class _Manager(BaseManager):
    pass


class TrackerProcess:
    """The driver's side: starts the helper at once, connects when the sweep opens."""

    def __init__(self, uri: str, study_db: Path | None = None):
        """`study_db`: the sweep's Optuna file, readied too where it does not exist yet."""
        self.uri, self.manager, self.lock = uri, None, threading.Lock()
        root = str(Path(__file__).resolve().parents[1])  # fxray importable however the driver was started
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        # its own session: the terminal's Ctrl+C goes to the driver, which still has runs to end
        cmd = [sys.executable, "-m", "fxray.mlhelper", uri, *([str(study_db)] if study_db else [])]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)

    def connect(self) -> _Manager:
        with self.lock:  # the driver's main thread (ready_study) and OpeningTracker's both come here
            if self.manager is None:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the MLflow helper process exited at start (code {self.proc.wait()})")
                where = json.loads(line)
                manager = _Manager(address=where["address"], authkey=bytes.fromhex(where["authkey"]))
                manager.connect()
                self.manager = manager
            return self.manager

    def ready_study(self) -> None:
        """Wait for the Optuna study file the helper readied and move it into place (its
        folder must exist by now); if the helper cannot, the driver creates the file itself."""
        self.connect().primer().ready_study()

    def open_sweep(self, sweep: dict):
        """A proxy of the sweep's Tracker (log_fold, end_trial, end_sweep, parent_id)."""
        return self.connect().open_sweep(sweep)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the helper exits on EOF, removing a store it readied for nothing
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class OpeningTracker:
    """The driver's Tracker while the helper opens the sweep: `store.open_sweep` and the
    parent run's id are fetched in a thread, so Tune starts meanwhile; log_fold and
    end_trial calls made before that are kept and replayed in order once it is open.

    `on_open(parent_run_id)` runs in that thread once the store is open (the driver
    records the id in sweep.json); `on_error(message)` runs there if it cannot be
    opened, or if on_open fails (the driver stops the sweep), and every later call
    is then a no-op."""

    def __init__(self, store: TrackerProcess, sweep: dict, on_open, on_error):
        self.tracker, self.error, self.pending = None, None, []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._open, args=(store, sweep, on_open, on_error),
                                       name="fxray-mlflow-open", daemon=True)
        self.thread.start()

    def _open(self, store, sweep, on_open, on_error) -> None:
        try:
            tracker = store.open_sweep(sweep)
            on_open(tracker.parent_id())
        except Exception as e:  # noqa: BLE001 (whatever the store says, in one line)
            text = str(e).strip()
            self.error = text.splitlines()[-1] if text else type(e).__name__
            on_error(self.error)
            return
        with self.lock:
            for name, args in self.pending:
                getattr(tracker, name)(*args)
            self.pending, self.tracker = [], tracker

    def _call(self, name: str, *args) -> None:
        with self.lock:
            if self.tracker is None:
                if self.error is None:
                    self.pending.append((name, args))
                return
        getattr(self.tracker, name)(*args)

    def log_fold(self, *args) -> None:
        self._call("log_fold", *args)

    def end_trial(self, *args) -> None:
        self._call("end_trial", *args)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the sweep is open (False if it could not be)."""
        self.thread.join(timeout)
        return self.tracker is not None

    def end_sweep(self, *args) -> int:
        """Waits for the queued writes, ends the parent run; returns how many writes failed
        (0 with nothing done where the store never opened: the driver reported that)."""
        return self.tracker.end_sweep(*args) if self.wait() else 0

    def parent_id(self) -> str | None:
        return self.tracker.parent_id() if self.wait() else None


_PRIMER: dict = {"thread": None, "study": None, "store": None, "temp": None,  # the helper's state
                 "study_done": threading.Event()}  # what _prime readied: (ready, target) pairs


def _prime(uri: str, study_db: str | None) -> None:
    """Ready the stores. A new Optuna study file first (small, and Tune opens it before
    any fold is logged) gets its tables in a temporary folder (the run directory may
    not exist yet). Then mlflow: an existing sqlite store is opened (schema checked);
    a new one gets its tables in a file beside it. ready_study and _open_primed move
    what was readied into place."""
    try:
        if study_db and not Path(study_db).exists():
            import optuna

            _PRIMER["temp"] = Path(tempfile.mkdtemp(prefix=f"fxray-study-{os.getpid()}-"))  # pid: whose it is
            ready = _PRIMER["temp"] / "optuna.db"
            optuna.storages.RDBStorage(f"sqlite:///{ready}")
            _PRIMER["study"] = (ready, Path(study_db))
    except Exception:  # noqa: BLE001 (the driver creates it then, and reports what is wrong)
        pass
    finally:
        _PRIMER["study_done"].set()
    try:
        from mlflow.tracking import MlflowClient

        path = sqlite_path(uri)
        if path is not None and not path.exists():
            ready = path.with_name(f".{path.name}.fxray-{os.getpid()}")
            _PRIMER["store"] = (ready, path)
            MlflowClient(f"sqlite:///{ready}").search_experiments(max_results=1)
        else:
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception:  # noqa: BLE001 (opening the store for real reports what is wrong)
        pass


def _move_in(ready: Path, target: Path) -> None:
    """`ready` becomes `target`, unless a target appeared meanwhile (never overwritten)."""
    try:
        if ready.exists() and target.parent.is_dir():
            if ready.parent != target.parent:  # maybe another filesystem: copy beside it first
                near = target.with_name(f".{target.name}.fxray-{os.getpid()}")
                shutil.copyfile(ready, near)
                ready.unlink()
                ready = near
            os.link(ready, target)
    except FileExistsError:
        pass
    finally:
        ready.unlink(missing_ok=True)


def _clean_up() -> None:
    """What was readied and never moved in goes (a sweep that did not start)."""
    for key in ("study", "store"):
        if _PRIMER[key] is not None:
            _PRIMER[key][0].unlink(missing_ok=True)
    if _PRIMER["temp"] is not None:
        shutil.rmtree(_PRIMER["temp"], ignore_errors=True)


class _Primer:
    """What the helper serves to the driver before the sweep opens."""

    def ready_study(self) -> None:
        _PRIMER["study_done"].wait()
        if _PRIMER["study"] is not None:
            _move_in(*_PRIMER["study"])
            _PRIMER["study"] = None


_THE_PRIMER = _Primer()


class QueuedTracker:
    """What the helper serves: log_fold and end_trial return at once and run in order on
    one thread of the helper, so the driver's Tune loop never waits on the store (a
    fold's writes take 6-35 ms here); end_sweep waits for what is queued.
    Queued writes outlive the driver: the helper drains them before it exits."""

    OPEN: list = []  # every one this helper served, drained at exit

    def __init__(self, tracker: Tracker):
        self.tracker, self.failed = tracker, 0
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()
        QueuedTracker.OPEN.append(self)

    def _drain(self) -> None:
        while True:
            call, args = self.queue.get()
            try:
                call(*args)
            except Exception as e:  # noqa: BLE001 (one failed write must not stop the others)
                self.failed += 1
                print(f"fxray.mlhelper: {call.__name__} failed: {e}", file=sys.stderr, flush=True)
            finally:
                self.queue.task_done()

    def log_fold(self, *args) -> None:
        self.queue.put((self.tracker.log_fold, args))

    def end_trial(self, *args) -> None:
        self.queue.put((self.tracker.end_trial, args))

    def end_sweep(self, *args) -> int:
        """Waits for the queued writes, ends the parent run; returns how many writes failed."""
        self.queue.join()
        self.tracker.end_sweep(*args)
        return self.failed

    def parent_id(self) -> str:
        return self.tracker.parent_run_id


def _open_primed(sweep: dict) -> QueuedTracker:
    _THE_PRIMER.ready_study()
    _PRIMER["thread"].join()
    if _PRIMER["store"] is not None:
        _move_in(*_PRIMER["store"])
        _PRIMER["store"] = None
    _clean_up()
    return QueuedTracker(open_sweep(sweep))


_Manager.register("open_sweep", _open_primed, exposed=("log_fold", "end_trial", "end_sweep", "parent_id"))
_Manager.register("primer", lambda: _THE_PRIMER, exposed=("ready_study",))


def serve(uri: str, study_db: str | None = None) -> None:
    """The helper's main: ready the stores in a thread, serve the Tracker until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _PRIMER["thread"] = threading.Thread(target=_prime, args=(uri, study_db), daemon=True)
    _PRIMER["thread"].start()
    authkey = os.urandom(16)
    server = _Manager(authkey=authkey).get_server()
    print(json.dumps({"address": server.address, "authkey": authkey.hex()}), flush=True)

    def exit_on_eof():
        sys.stdin.read()
        for tracker in QueuedTracker.OPEN:
            tracker.queue.join()
        _PRIMER["thread"].join(timeout=30)
        _clean_up()
        os._exit(0)

    threading.Thread(target=exit_on_eof, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    serve(*sys.argv[1:3])
