"""Fault drills through the real sweep CLI (local Ray, Optuna study, MLflow store, all real):
kill -9 of the driver at several points then --resume, a crafted run directory, two
sweeps on one run directory, a killed MLflow writer, diverged trials, changed data, and
what a local sweep listens on. docs/reliability.md lists them beside the bad inputs."""

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tune import check_complete_sweep, cli, fault_env, hand_made_results, setup, store, study

from fxray.sweep.rundir import held_by

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")]


def launch(args, env, cwd) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fxray.tune", *map(str, args)]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(cond, proc, timeout=180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended first ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    assert cond(), "timed out"


def fold_lines(tmp_path) -> list[dict]:
    path = tmp_path / "runs/t/folds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def proc_table() -> dict[int, tuple[int, str, str]]:
    """{pid: (parent pid, state, command line)} of every process (Linux /proc)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            out[int(entry.name)] = (int(ppid), state, cmd)
    return out


def descendants(pid: int) -> set[int]:
    table, out, todo = proc_table(), set(), [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, _, _) in table.items():
            if ppid == parent and child not in out:
                out.add(child)
                todo.append(child)
    return out


def ray_descendants(pid: int) -> set[int]:
    """The driver's descendants that are Ray's (not the MLflow writer, not the reaper)."""
    table = proc_table()
    return {
        p
        for p in descendants(pid)
        if p in table and "fxray.track.writer" not in table[p][2] and "fxray.sweep.reaper" not in table[p][2]
    }


def freeze(pid: int) -> set[int]:
    """SIGSTOP a process and all its descendants (again until no new one appears)."""
    stopped: set[int] = set()
    while todo := ({pid} | descendants(pid)) - stopped:
        for p in todo:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped |= todo
        time.sleep(0.05)
    return stopped


def alive(pids: set[int]) -> set[int]:
    table = proc_table()
    return {p for p in pids if p in table and table[p][1] != "Z"}


def children_running(pid: int, module: str) -> list[int]:
    return [c for c, (ppid, _, cmd) in proc_table().items() if ppid == pid and module in cmd]


def listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets these processes listen on (ss -ltnp)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def plant_payloads(run_dir: Path, marker: Path) -> int:
    """Replace every pickle in the run directory (and put one where Tune.restore would look)
    by one that creates `marker` when loaded: a run directory someone hands you."""

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    data = pickle.dumps(Payload())
    targets = set(run_dir.rglob("*.pkl")) | {run_dir / "tune/tuner.pkl", run_dir / "tune/session-1/tuner.pkl"}
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return len(targets)


POINTS = {  # when the driver is killed: a condition on the run directory (lab/drills.py kills it at
    # ten random moments of a sweep, the start of Tune before any fold among them, and checks the
    # same; this point is the CI's share)
    "mid-sweep": lambda tmp: len(fold_lines(tmp)) >= 4
}


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_the_driver_then_resume(tmp_path, point):
    """kill -9 of the driver, then --resume: every trial ends with exactly one MLflow run, no
    fold is trained-and-logged twice or lost, the round is marked done, the study has no
    RUNNING trial. Ray's processes of the killed session end with it. The killed driver held
    the run directory's lock: the resume takes it (a lock left by a killed sweep is stale).
    The resumed run directory's pickles were replaced by payloads: none is loaded."""
    exp, env = setup(tmp_path, trials=4, steps=60)  # folds of ~1 s
    proc = launch(["--experiment", exp, "--num-cpus", 2], env, tmp_path)
    wait_for(lambda: POINTS[point](tmp_path), proc)
    assert held_by(tmp_path / "runs/t") == str(proc.pid)
    ray_procs = ray_descendants(proc.pid)
    if point == "mid-sweep" and os.path.exists("/usr/bin/ss"):  # a local sweep listens on loopback only
        addresses = listening({proc.pid} | ray_procs)
        assert addresses, "found no listening socket of the sweep"
        bad = [a for a in addresses if not a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:"))]
        assert not bad, bad
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.time() + 30  # the reaper ends what Ray leaves
    while time.time() < deadline and alive(ray_procs):
        time.sleep(0.5)
    left = alive(ray_procs)
    assert not left, [proc_table()[p][2][:80] for p in left]
    marker = tmp_path / "PAYLOAD-RAN"
    assert plant_payloads(tmp_path / "runs/t", marker) >= 2
    out = cli(["--experiment", exp, "--num-cpus", 2, "--resume"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not marker.exists(), "a pickle of the run directory was loaded"
    check_complete_sweep(tmp_path, 4)  # one run per trial, one point per fold, the study COMPLETE
    folds = [(r["trial_id"], r["fold"]) for r in fold_lines(tmp_path)]
    assert len(folds) == len(set(folds)) == 4 * 2, folds
    sweep = json.loads((tmp_path / "runs/t/sweep.json").read_text())
    assert sweep["rounds"][-1]["done"]


def test_two_sweeps_on_one_run_directory(tmp_path):
    """The second is refused in one line (exit 2) and writes nothing; the first finishes
    its own round: 4 trials, one parent run."""
    exp, env = setup(tmp_path, trials=4, steps=30)
    first = launch(["--experiment", exp, "--num-cpus", 2], env, tmp_path)
    wait_for(lambda: (tmp_path / "runs/t/sweep.json").exists(), first)
    frozen = freeze(first.pid)  # so that every write seen is the second's
    try:
        before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs/t").rglob("*") if p.is_file()}
        second = cli(["--experiment", exp, "--num-cpus", 2], env, tmp_path, timeout=120)
        after = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs/t").rglob("*") if p.is_file()}
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert second.returncode == 2 and second.stdout == "", second.stderr[-3000:]
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith("fxray.tune: error: ") and f"another sweep (pid {first.pid}) is running" in line
    assert before == after
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    results = check_complete_sweep(tmp_path, 4)
    assert results["n_trials"] == 4


def without_shutdown_noise(err: str) -> str:
    """stderr less the lines of Ray workers that Ray's own SIGTERM at shutdown interrupted
    (its handler raises SystemExit, and Python prints "Exception ignored in ..." when that lands
    in a weakref callback): seen once on CI's box, after the sweep had ended. A worker's other
    output, and every line of the driver, stay."""
    prefix = re.compile(r"^(?:\x1b\[\d+m)?\((\w+) pid=(\d+)\)")
    noisy = set()
    for line in err.splitlines():
        m = prefix.match(line)
        if m and "sigterm_handler" in line:
            noisy.add(m.groups())
    return "\n".join(ln for ln in err.splitlines() if not ((m := prefix.match(ln)) and m.groups() in noisy))


def test_shutdown_noise_is_only_the_interrupted_worker():
    worker = "\x1b[36m(fold_trial pid=981)\x1b[0m"
    err = "\n".join(
        [
            f"{worker} Exception ignored in: <function WeakSet.__init__.<locals>._remove at 0x7f>",
            f"{worker} Traceback (most recent call last):",
            f'{worker}   File "ray/_private/worker.py", line 1063, in sigterm_handler',
            "\x1b[36m(fold_trial pid=982)\x1b[0m Traceback (most recent call last):",
            "fxray.tune: the MLflow writer had exited (code -9); starting it again",
        ]
    )
    left = without_shutdown_noise(err)
    assert "pid=981" not in left and "pid=982) Traceback" in left.replace("\x1b[0m", "")
    assert "Traceback" in without_shutdown_noise("Traceback (most recent call last):")


def test_a_killed_mlflow_writer_is_restarted_and_catches_up(tmp_path):
    exp, env = setup(tmp_path, trials=4, steps=40)
    proc = launch(["--experiment", exp, "--num-cpus", 2], env, tmp_path)
    wait_for(lambda: len(fold_lines(tmp_path)) >= 1, proc)
    (writer,) = children_running(proc.pid, "fxray.track.writer")
    os.kill(writer, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in without_shutdown_noise(err), err[-3000:]
    notes = [line for line in err.splitlines() if "MLflow writer" in line]
    # killed after it opened the store (finish() starts it again) or, on a loaded box, before
    # (the reader starts it again at once): either way once, and nothing is lost
    assert len(notes) == 1 and "starting it again to catch up from folds.jsonl" in notes[0], err[-3000:]
    check_complete_sweep(tmp_path, 4)


def test_a_writer_killed_before_it_opens_the_store_is_started_again(tmp_path):
    """Killed while it waits for sweep.json (before any fold): not a store that refused, so
    the driver starts it once more and it catches up; the sweep ends as if nothing happened."""
    exp, env = setup(tmp_path, trials=2, steps=20)
    proc = launch(["--experiment", exp, "--num-cpus", 2], env, tmp_path)
    wait_for(lambda: children_running(proc.pid, "fxray.track.writer"), proc)
    (writer,) = children_running(proc.pid, "fxray.track.writer")
    os.kill(writer, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    notes = [line for line in err.splitlines() if "MLflow writer" in line]
    assert len(notes) == 1 and "before it opened the store; starting it again" in notes[0], err[-3000:]
    check_complete_sweep(tmp_path, 2)


GIVEN = [  # (sampled config, folds); gamma >= 0.9 diverges (FXRAY_FAULT=diverge:0.9)
    ({"lr": 1e-3, "gamma": 0.85}, 2),
    ({"lr": 1e-3, "gamma": 0.95}, 2),
    ({"lr": 2e-4, "gamma": 0.97}, 2),
    ({"lr": 5e-4, "gamma": 0.82}, 2),
]


def test_diverged_trials_are_a_status_and_never_win_then_changed_data_is_refused(tmp_path):
    """Two of four given trials diverge on their first fold while the others lose money at a
    steep cost: the diverged ones have no score anywhere (results.json, MLflow, compare), are
    marked diverged (status, tag fxray.status) and cannot be the best trial. Then a byte of
    the data file is flipped: a new round and `train --from-run` refuse it in one line."""
    exp, env = setup(tmp_path, trials=4)
    exp.write_text(exp.read_text().replace("patience: 2}", "patience: 2, cost: 0.002}"))  # 20 bp a unit traded
    (tmp_path / "given.json").write_text(json.dumps(hand_made_results(tmp_path, exp, GIVEN)))
    fault_env(env, "diverge:0.9")
    out = cli(["--experiment", exp, "--num-cpus", 2, "--same-trials", "given.json", "--json", "r.json"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "r.json").read_text())
    by_gamma = {t["sampled"]["gamma"]: t for t in results["trials"]}
    for gamma, t in by_gamma.items():
        if gamma >= 0.9:
            assert (t["status"], t["score"], t["folds_done"]) == ("diverged", None, 1), t
        else:
            assert t["status"] == "ok" and t["score"] is not None and t["folds_done"] == 2
    assert by_gamma[results["best"]["sampled"]["gamma"]]["status"] == "ok"
    parents, children, client = store(tmp_path)
    for run in children:
        gamma = float(run.data.params["gamma"])
        assert run.data.tags["fxray.status"] == ("diverged" if gamma >= 0.9 else "ok")
        if gamma >= 0.9:  # nothing logged as a number it does not have
            assert "score" not in run.data.metrics and "val_sharpe" not in run.data.metrics
    states = [t.state.name for t in study(tmp_path).trials]
    assert states == ["COMPLETE"] * 4, states
    cmp = subprocess.run(
        [sys.executable, "-m", "fxray.compare", "t", "--no-log", "--json", "c.json", "--out", "cmp"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    (compared,) = json.loads((tmp_path / "c.json").read_text())["experiments"]
    assert compared["best"]["trial_id"] == results["best"]["trial_id"]

    # --- the data changes under the same stored hash --------------------------------------
    data = Path(results["data"]["path"])
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # inside the columns: the metadata (and its stored hash) stays
    data.write_bytes(bytes(raw))
    sweep_before = (tmp_path / "runs/t/sweep.json").read_text()
    again = cli(["--storage", "runs/t", "--num-cpus", 2, "--trials", 1], env, tmp_path, timeout=120)
    assert again.returncode == 2, again.stderr[-3000:]
    # found by the check that overlaps Ray's start: Ray's own start-up lines may come first
    lines = [line for line in again.stderr.strip().splitlines() if line.startswith("fxray.")]
    assert len(lines) == 1, again.stderr[-3000:]
    line = lines[0]
    assert "do not match its stored content hash" in line and str(data) in line
    assert (tmp_path / "runs/t/sweep.json").read_text() == sweep_before
    ok_child = next(r for r in children if r.data.tags["fxray.status"] == "ok")
    train = subprocess.run(
        [sys.executable, "-m", "fxray.train", "--from-run", ok_child.info.run_id, "--device", "cpu"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert train.returncode == 2, train.stderr[-3000:]
    assert train.stderr.strip().count("\n") == 0 and "do not match its stored content hash" in train.stderr


STUDY_MAKER = """
import sys
from fxray.sweep.rounds import load_study
import optuna  # imported before the signal: the kill lands inside the study's creation
print("go", flush=True)
load_study(sys.argv[1])
print("done", flush=True)
"""


def studies_in(storage: Path) -> list[str]:
    import optuna

    from fxray.sweep.rounds import STUDY_FILE, journal

    return optuna.get_all_study_names(storage=journal(storage / STUDY_FILE))


@pytest.mark.parametrize("delay_ms", [0, 10, 20, 40, 80, 160])
def test_a_kill_while_the_study_is_created_leaves_no_half_study(tmp_path, delay_ms):
    """kill -9 at several moments of the study's creation: the study's journal is then absent or
    holds the one study, and the resumed driver's loads (there are several) find exactly one."""
    from fxray.sweep.rounds import STUDY_FILE, load_study

    proc = subprocess.Popen([sys.executable, "-c", STUDY_MAKER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "go"
    time.sleep(delay_ms / 1000)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    if (tmp_path / STUDY_FILE).exists():
        assert studies_in(tmp_path) == ["fxray"]
    for _ in range(3):
        load_study(tmp_path).ask()
    assert studies_in(tmp_path) == ["fxray"]
    assert len(load_study(tmp_path).trials) == 3
