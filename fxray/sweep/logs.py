"""What a sweep prints besides its own lines: the libraries' noise kept below warning level
unless --verbose.

    quiet(verbose)                 in the driver, before anything starts (fxray.tune.main)
    with known_ray_lines(): ...    around the FoldWorkers' creation

What each piece was, and why this is the way to silence it (Ray 2.60, Optuna 5.0, MLflow 3.17):

- Ray's "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled
  to opt out" is a warning of one logger (ray._private.authentication.authentication_token_setup)
  when RAY_AUTH_MODE is unset and Ray turns token authentication on by default for a new
  local cluster: it says the secure default is in force, not that anything is wrong. That
  logger is set to ERROR; authentication itself is untouched (setting RAY_AUTH_MODE=token
  after `import ray` does not work: Ray reads its config at import).
- Optuna's "A new study created in RDB with name: fxray" is an INFO line of the "optuna"
  logger (its own handler, level INFO from import): set to WARNING.
- MLflow's "Creating initial MLflow database tables..." / "Updating database tables" are
  INFO lines of the writer process: MLFLOW_LOGGING_LEVEL=WARNING, inherited by it.
- Ray's `E ... core_worker.cc ... has constructor arguments in the object store and
  max_restarts > 0 ... the actor restart will fail` is a C++ ERROR line that Ray writes to
  the driver's stderr once per process when an actor that may restart gets an ObjectRef
  in its constructor (ray-project/ray#53727: Ray does not pin constructor arguments for a
  restart). It does not apply here: the driver holds that ref (driver.Run.arrays_ref) for
  the whole sweep, so a restarted FoldWorker always finds the data; a test restarts one
  (tests/test_tune.py, the worker-crash test). No log level reaches that one line without
  hiding every other C++ error, so `known_ray_lines` drops it, and only it, from the
  driver's stderr while the actors are created; anything else written there meanwhile is
  passed on.

- Tune's "Experiment has been interrupted ... Resume experiment with: Tuner.restore(...)" is a
  warning of the "ray.tune.tune" logger after Ctrl+C. It is wrong here: fxray never restores
  Tune's pickled state (`fxray tune --resume` rebuilds the round from its own files, and the
  driver prints that command), so `quiet` drops that one record, --verbose or not.

- Tune's "Trial task failed for trial ..." prints each failed trial's whole traceback (Ray's
  and the worker's frames, ~80 lines); TUNE_PRINT_ALL_TRIAL_ERRORS=0 turns it off and fxray
  prints the error's last line for the trial instead (callbacks.say_failed). The whole of it
  stays in the trial's error file under the run directory. The same error is printed once more
  when Ray's processes end ("Unhandled error ...": a failed trial's result, never fetched since
  the trial failed): RAY_IGNORE_UNHANDLED_ERRORS=1, read by the processes ray.init starts.

- A Ray worker process told to end (Tune ending its trial processes, Ray its workers) gets a
  SIGTERM, and Ray's handler raises SystemExit wherever Python is. Inside a callback Python
  cannot raise from (a weakref's, a `__del__`), it prints "Exception ignored in: ..." and the
  traceback instead, which Ray forwards to the driver's stderr: seen at random at the end of a
  sweep. `quiet_exit` (in the trial and worker processes) drops exactly that: an unraisable
  SystemExit (the process is ending anyway); any other unraisable exception is printed as before.

--verbose (FXRAY_VERBOSE=1) keeps the rest.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile

KNOWN_RAY_LINES = ("has constructor arguments in the object store and max_restarts > 0",)


def verbose() -> bool:
    return os.environ.get("FXRAY_VERBOSE", "") not in ("", "0")


def quiet(verbose_flag: bool = False) -> None:
    """Set the levels and the environment of this process and the ones it starts."""
    if verbose_flag:
        os.environ["FXRAY_VERBOSE"] = "1"
    logging.getLogger("ray.tune.tune").addFilter(lambda record: "Tuner.restore" not in record.getMessage())
    if verbose():
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # the writer process reads it
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")  # a trial's traceback: one line (callbacks)
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")  # the same error again, at exit, from its ref
    import optuna  # the driver imports it anyway (OptunaSearch); its logger exists once imported

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def quiet_exit() -> None:
    """This process's unraisable SystemExit (a SIGTERM met inside a callback) unprinted (module doc)."""
    if sys.unraisablehook is sys.__unraisablehook__:

        def hook(unraisable):
            if not issubclass(unraisable.exc_type, SystemExit):
                sys.__unraisablehook__(unraisable)

        sys.unraisablehook = hook


def local_ray_env() -> None:
    """Before a local ray.init: Ray's note that token authentication is on, kept out (module doc)."""
    if not verbose():
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


@contextlib.contextmanager
def known_ray_lines():
    """Drop KNOWN_RAY_LINES from what is written to file descriptor 2 inside the block (Ray's
    C++ logging writes there directly, below Python); everything else is written after it."""
    if verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = tmp.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not any(k in line for k in KNOWN_RAY_LINES)))
            sys.stderr.flush()


class _Tee(io.StringIO):
    """A StringIO that also writes through to `stream`."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def write(self, text):
        self.stream.write(text)
        return super().write(text)

    def flush(self):
        self.stream.flush()


@contextlib.contextmanager
def capture_stdout():
    """Print as usual and keep a copy: `with capture_stdout() as buf: ...; buf.getvalue()`."""
    with contextlib.redirect_stdout(_Tee(sys.stdout)) as buf:
        yield buf
