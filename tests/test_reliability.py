"""Bad inputs that used to give a traceback, a hang or a silently wrong answer (issue 18):
each is one line naming the file or key, exit 2, nothing written. The CLIs run in
subprocesses; the pieces behind them (the run-directory lock, divergence in the records,
the YAML reader) are checked directly too. The fault drills are in test_drills.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tune import TINY

from fxray.data.synth import SynthSpec, to_cache
from fxray.rl import experiment as expmod
from fxray.track.records import FoldRecord

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


SWEEP = {  # the least sweep.json a resume reads (fxray.sweep.rundir.check_record)
    "rounds": [{"name": "tune", "trials": 2, "seed": 0, "done": False}],
    "data": {"path": "m.fxcache", "content_hash": "0" * 32},
    "mlflow": {"uri": "sqlite:///mlflow.db"},
}


def run(module, *args, cwd, env=None, timeout=120):
    env = {**os.environ, "FXRAY_CACHE_DIR": str(cwd / "cache"), **(env or {})}
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{cwd / 'mlflow.db'}")
    cmd = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def one_line(out, *needles) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def work(tmp_path):
    """tiny.yaml, a small fxcache and nothing else in a fresh directory."""
    (tmp_path / "tiny.yaml").write_text(TINY.format(trials=2, steps=10, grace=2, folds=2, bars=20000))
    to_cache(SynthSpec(n_bars=20000, seed=0), tmp_path / "m.fxcache")
    return tmp_path


# --- the sweep CLI --------------------------------------------------------------------------


def test_tune_json_naming_a_directory_is_refused_before_the_sweep(work):
    (work / "out").mkdir()
    one_line(run("fxray.tune", "--experiment", "tiny.yaml", "--json", "out", cwd=work), "--json out: is a directory")
    assert not (work / "runs").exists() and not (work / "mlflow.db").exists()


def test_tune_storage_naming_a_file(work):
    (work / "afile").write_text("x")
    one_line(run("fxray.tune", "--experiment", "tiny.yaml", "--storage", "afile", cwd=work), "afile: is a file")
    assert (work / "afile").read_text() == "x"


@pytest.mark.parametrize("content", ["{not json", '{"rounds": []}', "[1, 2]"])
def test_tune_storage_holding_a_corrupt_sweep_json(work, content):
    (work / "old").mkdir()
    (work / "old/sweep.json").write_text(content)
    out = run("fxray.tune", "--storage", "old", "--resume", cwd=work)
    one_line(out, "old/sweep.json: not a sweep's record", "--storage DIR for a new sweep")
    assert (work / "old/sweep.json").read_text() == content and sorted(os.listdir(work / "old")) == ["sweep.json"]


def test_a_run_directory_of_an_earlier_fxray_is_refused_on_resume(work):
    """A sweep whose study is in SQLite (fxray before the Optuna journal) is refused in one line,
    and left as it was."""
    (work / "old").mkdir()
    (work / "old/sweep.json").write_text(json.dumps(SWEEP))
    (work / "old/optuna.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    out = run("fxray.tune", "--storage", "old", "--resume", cwd=work)
    one_line(out, "old/optuna.db: the study of an earlier fxray's sweep", "--storage DIR")
    assert sorted(os.listdir(work / "old")) == ["optuna.db", "sweep.json"]


def test_a_non_utf8_experiment_file(work):
    (work / "latin.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    one_line(run("fxray.tune", "--experiment", "latin.yaml", cwd=work), "latin.yaml: not UTF-8 text")
    assert not (work / "runs").exists()


def test_a_fifo_as_data_does_not_hang(work):
    os.mkfifo(work / "pipe.fxcache")
    t0 = time.time()
    out = run("fxray.tune", "--experiment", "tiny.yaml", "--data", "pipe.fxcache", cwd=work, timeout=60)
    one_line(out, "pipe.fxcache: is a FIFO, not an fxcache file")
    out = run("fxray.train", "--data", "pipe.fxcache", "--experiment", "tiny.yaml", cwd=work, timeout=60)
    one_line(out, "pipe.fxcache: is a FIFO")
    assert time.time() - t0 < 60 and not (work / "runs").exists()


@pytest.mark.parametrize(
    "uri,needle",
    [
        ("mlflw://localhost", "'mlflw' is not a store MLflow opens"),
        ("sqlite:///{dir}/tiny.yaml", "tiny.yaml is not an SQLite database"),
    ],
)
def test_a_bad_tracking_uri_is_found_before_ray_and_leaves_nothing(work, uri, needle):
    out = run("fxray.tune", "--experiment", "tiny.yaml", cwd=work, env={"MLFLOW_TRACKING_URI": uri.format(dir=work)})
    assert not one_line(out, "MLFLOW_TRACKING_URI", needle).startswith("fxray.tune: error: ---")
    assert not (work / "runs").exists() and "Ray" not in out.stderr


# --- the train CLI --------------------------------------------------------------------------


def test_train_set_with_a_broken_yaml_value(work):
    out = run("fxray.train", "--data", "m.fxcache", "--experiment", "tiny.yaml", "--set", "lr=[1", cwd=work)
    one_line(out, "--set 'lr=[1': '[1' is not a YAML value")


@pytest.mark.parametrize(
    "line,needle", [("grad_clip: .nan", "dqn.grad_clip"), ("reward_scale: .inf", "dqn.reward_scale")]
)
def test_non_finite_config_values_in_an_experiment_file(work, line, needle):
    text = (work / "tiny.yaml").read_text().replace("patience: 2}", f"patience: 2, {line}}}")
    (work / "nan.yaml").write_text(text)
    out = run("fxray.train", "--data", "m.fxcache", "--experiment", "nan.yaml", cwd=work)
    one_line(out, "nan.yaml", needle, "must be a number > 0")
    with pytest.raises(expmod.ExperimentError, match=needle):
        expmod.load(work / "nan.yaml")


# --- the data and compare CLIs ---------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["synth", "build"])
def test_data_out_naming_a_directory(work, cmd):
    (work / "outdir").mkdir()
    args = ["--bars", "100"] if cmd == "synth" else ["--bars", "m.fxcache"]
    one_line(run("fxray.data_cmd", cmd, *args, "--out", "outdir", cwd=work), "--out outdir: is a directory")
    assert list((work / "outdir").iterdir()) == []


def test_data_info_finds_a_flipped_byte(work):
    out = run("fxray.data_cmd", "info", "m.fxcache", "--json", "i.json", cwd=work)
    assert out.returncode == 0 and "content hash blake3" in out.stdout and "matches" in out.stdout, out.stderr
    raw = bytearray((work / "m.fxcache").read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (work / "m.fxcache").write_bytes(bytes(raw))
    one_line(run("fxray.data_cmd", "info", "m.fxcache", cwd=work), "do not match its stored content hash")


def test_data_info_on_feature_names_of_the_wrong_type(work):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(str(work / "m.fxcache")) as src:
        table = ipc.open_file(src).read_all()
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    meta["feature_names"] = json.dumps({"not": "a list"})
    table = table.replace_schema_metadata(meta)
    with ipc.new_file(work / "bad.fxcache", table.schema) as w:
        w.write_table(table)
    one_line(run("fxray.data_cmd", "info", "bad.fxcache", cwd=work), "feature_names: must be a JSON list of 42 strings")


def test_compare_on_a_file_that_is_not_a_database(work):
    out = run("fxray.compare", "--tracking-uri", f"sqlite:///{work / 'tiny.yaml'}", "--no-log", cwd=work)
    one_line(out, "is not an SQLite database")


def test_compare_out_naming_a_file(work):
    (work / "notadir").write_text("x")
    one_line(run("fxray.compare", "--out", "notadir", "--no-log", cwd=work), "--out notadir: is not a directory")


# --- YAML as people write it -----------------------------------------------------------------


def test_yaml_reads_1e_3_as_a_number_and_refuses_duplicate_keys(tmp_path):
    text = TINY.format(trials=2, steps=10, grace=2, folds=2, bars=20000).replace("low: 1.0e-4", "low: 1e-4")
    (tmp_path / "a.yaml").write_text(text.replace("patience: 2}", "patience: 2, lr: 1e-3}"))
    exp = expmod.load(tmp_path / "a.yaml")
    assert exp.config.lr == 0.001 and exp.search[0].low == 1e-4
    (tmp_path / "dup.yaml").write_text(text + "name: u\n")
    with pytest.raises(expmod.ExperimentError, match=r"dup.yaml: not valid YAML: line \d+, column 1: key 'name'"):
        expmod.load(tmp_path / "dup.yaml")
    from fxray.train import parse_sets

    assert parse_sets(["lr=1e-3", "hidden=128", "dueling=false"]) == {"lr": 0.001, "hidden": 128, "dueling": False}


def test_an_empty_experiment_file_is_an_error_not_the_default_sweep(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing here\n")
    with pytest.raises(expmod.ExperimentError, match="empty.yaml: is empty"):
        expmod.load(tmp_path / "empty.yaml")


def test_an_embargo_below_the_feature_lookback_is_refused(tmp_path):
    from fxray.data.folds import default_embargo

    text = TINY.format(trials=2, steps=10, grace=2, folds=2, bars=20000)
    (tmp_path / "e.yaml").write_text(text.replace("max_folds: 2}", f"max_folds: 2, embargo: {default_embargo() - 1}}}"))
    with pytest.raises(expmod.ExperimentError, match="e.yaml: folds.embargo: .* below the longest feature lookback"):
        expmod.load(tmp_path / "e.yaml")
    (tmp_path / "ok.yaml").write_text(text.replace("max_folds: 2}", f"max_folds: 2, embargo: {default_embargo()}}}"))
    assert expmod.load(tmp_path / "ok.yaml").folds.embargo == default_embargo()


# --- the run directory's lock ------------------------------------------------------------------


def test_one_driver_at_a_time_and_a_dead_ones_lock_is_stale(tmp_path):
    from fxray.sweep.rundir import UsageError, held_by, hold

    storage = tmp_path / "runs/s"
    with hold(storage, None):
        assert held_by(storage) == str(os.getpid())
        with pytest.raises(UsageError, match=f"another sweep \\(pid {os.getpid()}\\) is running"):
            with hold(storage, None):
                pass
        (storage / "sweep.json").write_text(json.dumps({**SWEEP, "rounds": [{**SWEEP["rounds"][0], "done": True}]}))
    assert held_by(storage) is None and (storage / ".lock").exists()  # kept once a sweep is there
    # a holder killed with SIGKILL: the kernel dropped its flock; its pid is still in the file
    code = f"import fcntl, os, time; fd = os.open({str(storage / '.lock')!r}, os.O_RDWR); "
    code += "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, b'999999\\n', 0); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held" and held_by(storage) == "999999"
    holder.kill()
    holder.wait()
    expected = json.loads((storage / "sweep.json").read_text())
    with hold(storage, expected):
        assert (storage / ".lock").read_text().strip() == str(os.getpid())


def test_a_lock_on_a_new_run_directory_leaves_nothing_when_nothing_started(tmp_path):
    from fxray.sweep.rundir import hold

    with pytest.raises(RuntimeError):
        with hold(tmp_path / "runs/new", None):
            assert (tmp_path / "runs/new/.lock").exists()
            raise RuntimeError("refused after the lock")
    assert list(tmp_path.iterdir()) == []


# --- divergence: a status, never a score --------------------------------------------------------


def fold(trial_id, k, status="ok", score=0.0):
    rec = FoldRecord(fold=k, status=status, score=score, folds_done=k + 1).flat()
    rec.update(trial_id=trial_id, config={"lr": 1e-3})
    return rec


def test_a_diverged_trial_has_no_score_and_never_wins():
    from fxray.track.results import best_trial, trials_table

    records = {(r["trial_id"], r["fold"]): r for r in (fold("a", 0, "diverged", -1e4), fold("b", 0, score=-3.0))}
    assert best_trial(records, 1)["trial_id"] == "b"  # a losing trial still beats one that diverged
    assert trials_table(records)["a"]["score"] is None and trials_table(records)["a"]["status"] == "diverged"
    only = {("a", 0): fold("a", 0, "diverged", -1e4)}
    assert best_trial(only, 1) is None
    metrics = FoldRecord.from_flat(fold("a", 0, "diverged", -1e4)).mlflow_metrics()
    assert "score" not in metrics and not any(k.startswith(("val_", "test_")) for k in metrics)
    assert FoldRecord.from_flat(fold("b", 0, score=-3.0)).mlflow_metrics()["score"] == -3.0


def test_compare_never_picks_a_diverged_trial():
    from fxray.track.results import chosen

    trials = [
        {"trial_id": "a", "status": "diverged", "score": None, "folds_done": 1},
        {"trial_id": "b", "status": "ok", "score": -2.0, "folds_done": 2},
    ]
    assert chosen(trials, 2)["trial_id"] == "b"
    assert chosen(trials[:1], 2) is None


def test_results_of_a_sweep_where_every_trial_diverged(tmp_path, capsys):
    from fxray.track.results import write_results

    sweep = {
        "experiment": "t",
        "profile": "cpu",
        "data": {},
        "folds": [{"k": 0}],
        "base": {"cost": 1e-4},
        "rounds": [{"name": "tune", "trials": 1}],
    }
    (tmp_path / "experiment.yaml").write_text("name: t\n")
    summary = write_results(tmp_path, sweep, {("a", 0): fold("a", 0, "diverged", -1e4)}, [], 1.0)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["best"] is None and results["trials"][0]["status"] == "diverged"
    assert results["trials"][0]["score"] is None and "best_score" not in summary["mlflow_summary"]
    assert "no chosen trial: all 1 trials diverged" in capsys.readouterr().out


def test_csv_errors_quote_the_bad_value(tmp_path):
    from fxray.data.bars import BarsError, load_bars

    path = Path(tmp_path / "b.csv")
    path.write_text("timestamp,open,high,low,close\n2024-01-01 00:00:00,1,1,1,1.5\n2024-01-01 00:01:00,1,1,1,oops\n")
    with pytest.raises(BarsError, match=r"'oops' at data row 2 \(1 = the first after the header\)"):
        load_bars(path)


def test_resume_refuses_a_data_file_replaced_by_another(work):
    """A run directory whose sweep ran on other contents than the data file holds now."""
    (work / "old").mkdir()
    (work / "old/experiment.yaml").write_text((work / "tiny.yaml").read_text())
    sweep = {
        "rounds": [{"name": "tune", "trials": 2, "seed": 0, "done": False}],
        "data": {"path": str(work / "m.fxcache"), "content_hash": "0" * 32},
        "mlflow": {"uri": f"sqlite:///{work / 'mlflow.db'}"},
    }
    (work / "old/sweep.json").write_text(json.dumps(sweep))
    one_line(
        run("fxray.tune", "--storage", "old", "--resume", cwd=work), "its contents changed since the sweep started"
    )
    assert sorted(os.listdir(work / "old")) == ["experiment.yaml", "sweep.json"]


def test_train_json_naming_a_directory_is_refused_before_training(work):
    (work / "out").mkdir()
    out = run("fxray.train", "--data", "m.fxcache", "--experiment", "tiny.yaml", "--json", "out", cwd=work)
    one_line(out, "--json out: is a directory")
    assert "fold" not in out.stdout


# --- issue 51, reliability round two: each item reproduced, then held -----------------------


def tune_args(*argv):
    from fxray.tune import build_parser

    return build_parser().parse_args(list(argv))


def test_item1_resume_keeps_search_overrides(work, monkeypatch):
    """A sweep started with --set search.* / sweep.* / --population resumes with them (it used to
    resume from the bare experiment file: another search space, other ASHA settings); a resume
    that passes other values is refused in one line naming the key."""
    from fxray.sweep.driver import validate
    from fxray.sweep.rundir import UsageError, prepare_storage

    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    sets = ["--set", "search.lr.high=2e-4", "--set", "sweep.grace_folds=1", "--population", "2"]
    first = tune_args("--experiment", "tiny.yaml", "--data", "m.fxcache", "--storage", "s", *sets)
    plan = validate(first)
    exp = expmod.load(plan.file, "cpu", plan.overrides)
    prepare_storage(plan, exp, "cpu", [])
    resumed = validate(tune_args("--storage", "s", "--resume"))
    again = expmod.load(resumed.file, "cpu", resumed.overrides)
    assert [p.high for p in again.search if p.name == "lr"] == [2e-4]
    assert again.sweep.grace_folds == 1 and again.sweep.population == 2
    assert validate(tune_args("--storage", "s", "--resume", *sets)).overrides == resumed.overrides
    for other in (["--set", "search.lr.high=3e-3"], ["--set", "sweep.grace_folds=2"], ["--population", "3"],
                  ["--trials", "7"], ["--seed", "5"]):  # fmt: skip
        with pytest.raises(UsageError, match="drop"):
            validate(tune_args("--storage", "s", "--resume", *other))


def test_item2_export_force_replaces_only_a_bundle(work, tmp_path):
    """--force used to delete any directory at --out and hide a file as .NAME.old.PID."""
    from fxray.policy.export import ExportError, check_out

    (work / "home").mkdir()
    (work / "home/notes.txt").write_text("mine")
    (work / "afile").write_text("mine")
    for out in ("home", "afile"):
        with pytest.raises(ExportError, match="is not a policy bundle"):
            check_out(work / out, force=True)
    assert (work / "home/notes.txt").read_text() == "mine" and (work / "afile").read_text() == "mine"
    assert not [p for p in work.iterdir() if p.name.startswith(".")]
    (work / "b").mkdir()
    (work / "b/manifest.json").write_text('{"format": "fxray.policy"}')
    check_out(work / "b", force=True)  # fxray's own bundle: replaced
    with pytest.raises(ExportError, match="exists; pass --force"):
        check_out(work / "b", force=False)


def test_item4_a_torn_last_line_is_dropped_and_a_garbage_line_refused(tmp_path):
    """A kill in mid-write leaves a torn last line: the next append used to glue onto it, and
    every later --resume failed on the garbage line; now the torn line is cut under the lock,
    and a complete line that no driver writes is refused naming the file and line."""
    from fxray.sweep.rundir import UsageError, check_logs, drop_torn_lines

    rec = json.dumps({"trial_id": "0000", "fold": 0, "status": "ok"})
    (tmp_path / "folds.jsonl").write_text(rec + "\n" + rec[:20])
    (tmp_path / "events.jsonl").write_text('{"kind": "trial_end"}\n{"ki')
    check_logs(tmp_path)  # what a crash leaves: accepted
    drop_torn_lines(tmp_path)
    assert (tmp_path / "folds.jsonl").read_text() == rec + "\n"
    assert (tmp_path / "events.jsonl").read_text() == '{"kind": "trial_end"}\n'
    (tmp_path / "events.jsonl").write_text('{"kind": "trial_end"}\ngarbage\n')
    with pytest.raises(UsageError, match=r"events.jsonl line 2: not a record"):
        check_logs(tmp_path)


def test_a_missing_or_broken_baselines_file_is_one_line_naming_it(tmp_path):
    """folds.jsonl names each fold's references' returns by their file in the run directory
    (fxray.track.records.put_baselines); one gone, not JSON, or named outside baselines/ is refused
    before anything runs, naming the file."""
    from fxray.sweep.rundir import UsageError, check_logs

    name = "baselines/" + "ab" * 12 + ".json"
    rec = {"trial_id": "0000", "fold": 0, "status": "ok", "baselines_file": name}
    (tmp_path / "folds.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "baselines").mkdir()
    (tmp_path / name).write_text('{"oracle": {}}')
    check_logs(tmp_path)
    for broken in ("{not json", None):
        if broken is None:
            (tmp_path / name).unlink()
        else:
            (tmp_path / name).write_text(broken)
        with pytest.raises(UsageError, match=rf"{name}: missing or not the JSON .*folds.jsonl names"):
            check_logs(tmp_path)
    (tmp_path / "folds.jsonl").write_text(json.dumps({**rec, "baselines_file": "../sweep.json"}) + "\n")
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(UsageError, match="missing or not the JSON"):
        check_logs(tmp_path)


def test_a_torn_last_line_of_the_study_is_dropped_before_the_study_is_read(tmp_path):
    """Optuna's journal cannot be asked again after a torn last line (a kill in mid-append);
    the run directory's torn-line cut, under the lock before the driver reads anything, gives
    back the study as it was."""
    from fxray.sweep.rounds import STUDY_FILE, load_study
    from fxray.sweep.rundir import check_logs, drop_torn_lines

    load_study(tmp_path).ask()
    journal = tmp_path / STUDY_FILE
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code": 5, "worker_id": "x", "trial_id": 0, "sta')
    check_logs(tmp_path)  # what a crash leaves: accepted
    drop_torn_lines(tmp_path)
    assert journal.read_bytes() == whole
    load_study(tmp_path).ask()
    assert [t.state.name for t in load_study(tmp_path).trials] == ["RUNNING", "RUNNING"]


def test_item4_an_out_of_range_seed_in_sweep_json_is_refused(tmp_path):
    from fxray.sweep.rundir import UsageError, read_sweep

    sweep = {
        "rounds": [{"name": "tune", "trials": 2, "seed": 2**70, "done": False}],
        "data": {"path": "x", "content_hash": "0" * 32},
        "mlflow": {"uri": "sqlite:///x"},
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    with pytest.raises(UsageError, match=r"rounds\[0\].seed: .* outside \[0, 2\*\*32\)"):
        read_sweep(tmp_path)


def test_item5_a_bundle_is_checked_file_by_file_and_value_by_value(tmp_path):
    """A file not in the manifest, a path out of the bundle, NaN statistics, a bad cost, fill or dtype."""
    from fxray.policy.bundle import BundleError, check_files, check_manifest

    (tmp_path / "b/members").mkdir(parents=True)
    (tmp_path / "b/members/x.onnx").write_bytes(b"x")
    with pytest.raises(BundleError, match="not in manifest.json"):
        check_files(tmp_path / "b", {})
    with pytest.raises(BundleError, match="outside the bundle"):
        check_files(tmp_path / "b", {"../../etc/passwd": "0", "members/x.onnx": "0"})
    good = {
        "files": {"w": "0", "o": "0"},
        "members": [{"name": "fold0", "weights": "w", "onnx": "o"}],
        "network": {"n_inputs": 2, "input_dtype": "float32"},
        "inputs": {"feature_names": ["a"], "ofi_names": ["b"], "warmup_bars": 5},
        "trading": {"cost": 1e-4, "fill": "next_open"},
        "data": {"content_hash": "0" * 32},
    }
    check_manifest(good)
    cases = [("cost", -1e-4, "trading.cost"), ("cost", "x", "trading.cost"), ("cost", float("nan"), "trading.cost")]
    for key, value, needle in [*cases, ("fill", "teleport", "trading.fill")]:
        bad = json.loads(json.dumps(good))
        bad["trading"][key] = value
        with pytest.raises(ValueError, match=needle):
            check_manifest(bad)
    bad = json.loads(json.dumps(good))
    bad["network"]["input_dtype"] = "float64"
    with pytest.raises(ValueError, match="network.input_dtype"):
        check_manifest(bad)


def test_item6_a_read_only_run_directory_is_one_line(tmp_path):
    """It used to be a 69-line traceback from the lock file's open."""
    from fxray.sweep.rundir import UsageError, hold

    (tmp_path / "s").mkdir()
    os.chmod(tmp_path / "s", 0o555)
    if os.geteuid() == 0:  # root writes through mode bits: a read-only bind mount
        subprocess.run(["mount", "--bind", str(tmp_path / "s"), str(tmp_path / "s")], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(tmp_path / "s")], check=True)
    try:
        with pytest.raises(UsageError, match="cannot be written"):
            with hold(tmp_path / "s", None):
                pass
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(tmp_path / "s")], check=True)
        os.chmod(tmp_path / "s", 0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk needs a tmpfs mount (root)")
def test_a_full_disk_is_one_line(work):
    """No space left where the run directory goes: one line saying so and how to go on, exit 1
    (lab/drills.py fills the disk mid-sweep too: the same line, and --resume finishes the sweep)."""
    full = work / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={full / 'fill'}", "bs=4k"], capture_output=True)
        out = run("fxray.tune", "--experiment", "tiny.yaml", "--storage", full / "t", cwd=work)
    finally:
        subprocess.run(["umount", str(full)], check=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fxray.tune: error: no space left on the device"), lines
    assert "--resume continues a sweep that had started" in lines[0]


def test_item6_a_tracking_server_that_does_not_answer_is_refused_in_seconds(work):
    """fxray compare used to hang ~250 s in MLflow's retries."""
    t0 = time.time()
    one_line(run("fxray.compare", "--tracking-uri", "http://127.0.0.1:9", "--no-log", cwd=work), "no tracking server")
    assert time.time() - t0 < 60


def test_item7_a_full_length_content_hash_is_accepted(work):
    """Another writer's full 64-hex digest used to be refused as 'changed or damaged'; anything
    but 32 or 64 hex digits is refused saying what is expected."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from fxray.data import cache
    from fxray.data.integrity import content_hash

    m = cache.open(work / "m.fxcache")
    full = content_hash(m.ts, m.features, m.ofi, m.targets, digits=64)
    with pa.memory_map(str(work / "m.fxcache")) as src:
        table = ipc.open_file(src).read_all()
    for name, digest in (("full", full), ("short", full[:20])):
        meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
        meta["content_hash"] = json.dumps(digest)
        edited = table.replace_schema_metadata(meta)
        with ipc.new_file(work / f"{name}.fxcache", edited.schema) as w:
            w.write_table(edited)
    ok = cache.open(work / "full.fxcache")
    assert ok.content_hash == m.content_hash  # opened: values and the 64-digit hash checked
    with pytest.raises(cache.CacheError, match="first 32 or all 64 hex digits"):
        cache.open(work / "short.fxcache")


def test_item8_seed_errors_name_the_flag(work):
    for module, args in (("fxray.tune", ["--experiment", "tiny.yaml", "--seed", "-1"]),
                         ("fxray.train", ["--data", "m.fxcache", "--seed", str(2**64)])):  # fmt: skip
        out = run(module, *args, cwd=work)
        one_line(out, "argument --seed", "is not a seed")
