"""Ray's processes of OUR local session, ended when the driver ends however it ends.

    driver:  reaper = start_reaper(node_id, session_dir)   # right after a local ray.init
    process: python -m fxray.sweep.reaper NODE_ID SESSION_DIR

A local Ray dies with its driver, except its DashboardAgent and RuntimeEnvAgent, which
outlive a driver killed with SIGKILL (their parent is the raylet; they are re-parented to
init and wait forever). This process waits for its stdin to close (the driver's end: a
clean exit, a crash or a kill -9 alike), gives a clean `ray.shutdown` a moment, then ends
every process of this user that belongs to that one session: its environment names the
node (RAY_NODE_ID), its command line names the session directory, or it holds a file of
that directory open (the agents keep their logs there). Nothing else is
touched: not another user's Ray, not another session of ours, not a cluster (--address).
Stdlib only, so it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 1.0  # after the driver's end: a clean ray.shutdown is done by then
TERM_S = 3.0  # SIGTERM, then SIGKILL for what is still there


def start_reaper(node_id: str, session_dir: str) -> subprocess.Popen:
    """The reaper of this session, holding the read end of a pipe the driver never writes."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen(
        [sys.executable, "-m", "fxray.sweep.reaper", node_id, session_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl+C to the terminal's group does not reach it
    )


def session_pids(node_id: str, session_dir: str) -> list[int]:
    """This user's processes of one Ray session (not this one)."""
    me, uid, out = os.getpid(), os.getuid(), []
    marks = (f"RAY_NODE_ID={node_id}".encode(), session_dir.encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marks[0] in env or marks[1] in cmd or _holds_file_in(entry, session_dir):
            out.append(int(entry.name))
    return out


def _holds_file_in(proc: Path, directory: str) -> bool:
    """Whether the process has a file of `directory` open (Ray's agents keep their session's
    log files open; their command line is rewritten and their environment may not name it)."""
    prefix = directory.rstrip("/") + "/"
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(fd).startswith(prefix):
                return True
    return False


def reap(node_id: str, session_dir: str) -> None:
    """SIGTERM the session's processes, SIGKILL the ones left."""
    for pid in session_pids(node_id, session_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + TERM_S
    while time.time() < deadline and session_pids(node_id, session_dir):
        time.sleep(0.1)
    for pid in session_pids(node_id, session_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def main(node_id: str, session_dir: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()  # returns when the driver's end of the pipe closes
    time.sleep(GRACE_S)
    if Path("/proc").is_dir():
        reap(node_id, session_dir)


if __name__ == "__main__":
    main(*sys.argv[1:3])
