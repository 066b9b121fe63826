"""One sweep at a time in a run directory: an flock on <storage>/.lock, held for the driver's life.

    with hold(storage, expected_sweep):    # UsageError (one line, exit 2) if another driver holds it
        ...                                # start, fit, finish

The kernel releases an flock when its process dies, however it dies, so a lock left by
a killed sweep is stale by construction: the next driver simply takes it (the pid in the
file is only for the message). A driver that took the lock on a run directory it had to
create, and then started nothing (no sweep.json), removes what it created on the way out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from fxray.sweep.rundir import UsageError, read_sweep

LOCK = ".lock"


def held_by(storage: Path) -> str | None:
    """The pid (as written) of the driver holding the run directory's lock now, else None.
    Writes nothing: a probe before anything else is checked."""
    try:
        fd = os.open(Path(storage) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)  # (releases our probe's lock, if it got it)
    return None


def refusal(storage: Path, pid: str) -> str:
    return (
        f"{storage}: another sweep (pid {pid}) is running in this run directory; "
        "wait for it to end, or pass --storage DIR for a separate sweep"
    )


@contextlib.contextmanager
def hold(storage: Path, expected: dict | None):
    """Hold the run directory's lock; `expected` is the sweep.json the caller validated against
    (None: no sweep there): if another driver changed it before we got the lock, refuse."""
    storage = Path(storage)
    created = [p for p in (storage, *storage.parents) if not p.exists()]
    if storage.exists() and not storage.is_dir():
        raise UsageError(f"--storage {storage}: is a file, not a run directory; pass a directory")
    storage.mkdir(parents=True, exist_ok=True)
    fd = os.open(storage / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UsageError(refusal(storage, holder)) from None
    try:
        if read_sweep(storage) != expected:
            raise UsageError(f"{storage}: its sweep.json changed while this sweep was being checked; run it again")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        unused = not (storage / "sweep.json").exists()
        if unused:  # nothing was started here: leave no trace of us
            with contextlib.suppress(OSError):
                os.unlink(storage / LOCK)
            for d in created:  # deepest first
                with contextlib.suppress(OSError):
                    d.rmdir()
        os.close(fd)  # releases the flock
