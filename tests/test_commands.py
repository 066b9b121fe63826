"""The `fxray` command and its subcommands' command lines: the console script, --version,
the dispatch table, help text on every flag, the `book` extra's one-line error, --set and
--tracking-uri on tune, and --resume of a finished sweep."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import fxray
from fxray import cli

ROOT = Path(__file__).resolve().parents[1]


def run_py(*args, code: str | None = None, cwd=None, env=None, timeout=300):
    """`python -m fxray.cli ARGS` (or `python -c CODE`) with this checkout first on the path."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "fxray.cli", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    return subprocess.run(cmd, cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# --- the console script ------------------------------------------------------------------------


def test_the_console_script_is_declared_and_resolves():
    """pyproject.toml's [project.scripts] fxray -> fxray.cli:main, and the version has one source."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry = project["project"]["scripts"]["fxray"]
    assert entry == "fxray.cli:main"
    module, _, name = entry.partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is cli.main
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fxray.__version__"}


def test_fxray_version_prints_the_package_version():
    out = run_py("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"fxray {fxray.__version__}", out
    # the entry point as the installed script calls it: main() with sys.argv
    out = run_py(code="import sys; from fxray.cli import main; sys.argv = ['fxray', '-V']; sys.exit(main())")
    assert out.returncode == 0 and out.stdout.strip() == f"fxray {fxray.__version__}", out


@pytest.mark.parametrize("command", ["tune", "train", "data", "compare"])
def test_fxray_dispatches_to_each_command_with_the_rest_of_the_line(command):
    """`fxray CMD --help` is that module's own parser (its usage names `fxray CMD`), exit 0."""
    out = run_py(command, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: fxray {command}"), out.stdout[:200]


def test_fxray_runs_a_command_end_to_end(tmp_path):
    """`fxray data synth ...` does what `python -m fxray.data_cmd synth ...` does."""
    out = run_py("data", "synth", "--bars", "3000", "--seed", "1", "--out", tmp_path / "s.fxcache")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "s.fxcache").is_file() and "3,000 synthetic 1-min bars, seed 1" in out.stdout


def test_fxray_without_a_known_command():
    out = run_py("nope")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"fxray: error: 'nope' is not a command; known: {', '.join(cli.COMMANDS)} (fxray --help)"
    ]
    out = run_py()
    assert out.returncode == 2 and "commands:" in out.stdout and "  tune " in out.stdout


# --- help that documents --------------------------------------------------------------------


def parsers():
    from fxray import backtest, compare, export, live, train, tune
    from fxray import data_cmd as data

    out = {}
    commands = (("tune", tune), ("train", train), ("compare", compare), ("data", data), ("export", export))
    for name, module in (*commands, ("backtest", backtest), ("live", live)):
        p = module.build_parser()
        out[name] = p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.update({f"{name} {sub}": sp for sub, sp in action.choices.items()})
    return out


def test_every_flag_has_help_and_a_metavar_that_says_what_it_is():
    for name, p in parsers().items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest}: no help"
            takes_value = action.nargs != 0 and not isinstance(action, argparse._SubParsersAction)
            if takes_value and action.choices is None:
                assert action.metavar, f"{name} {action.option_strings or action.dest}: no metavar"


def test_help_shows_the_examples():
    p = parsers()
    assert "fxray tune --experiment experiments/smoke.yaml" in p["tune"].format_help()
    assert "--resume" in p["tune"].format_help() and "--set KEY=VALUE" in p["tune"].format_help()
    assert "fxray train --from-run" in p["train"].format_help()
    assert "fxray data synth --bars" in p["data"].format_help()
    assert "fxray compare smoke" in p["compare"].format_help()
    synth = p["data synth"].format_help()
    assert "--seed INT" in synth and "--out FXCACHE" in synth


# --- the order-flow extra --------------------------------------------------------------------


def test_book_without_the_extra_is_one_line_naming_it(tmp_path):
    """numba hidden (as in an install without 'fxray[book]'): one line, exit 2, nothing written."""
    out_file = tmp_path / "es.fxcache"
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from fxray.data_cmd import main\n"
        f"sys.exit(main(['build', '--book', 'x.mbo.dbn.zst', '--bar', '10s', '--out', {str(out_file)!r}]))"
    )
    out = run_py(code=code)
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [
        "error: build --book: order flow needs the `book` extra (numba not installed): pip install 'fxray[book]'"
    ]
    assert list(tmp_path.iterdir()) == []


def test_the_readme_book_example_points_at_a_file_that_exists(shared_data):
    paths = re.findall(r"--book (\S+)", (ROOT / "README.md").read_text())
    assert paths, "the README has a --book example"
    for p in paths:
        assert (ROOT / p).is_file(), p


# --- tune's flags -----------------------------------------------------------------------------

TINY = """\
name: t
data: {synth: {n_bars: 20000, seed: 0}}
folds: {train: 4d, val: 2d, test: 2d, max_folds: 2}
dqn: {num_envs: 16, batch_size: 64, hidden: 16, buffer_steps: 32, episode_len: 32, epochs: 2, steps_per_epoch: 10}
search:
  lr: {type: loguniform, low: 1.0e-4, high: 3.0e-3}
sweep: {trials: 2, seed: 0, grace_folds: 1, reduction_factor: 2}
"""


def tune_args(tmp_path, *extra):
    from fxray import tune

    (tmp_path / "tiny.yaml").write_text(TINY)
    return tune.build_parser().parse_args(
        ["--experiment", str(tmp_path / "tiny.yaml"), "--storage", str(tmp_path / "run"), *extra]
    )


def test_set_overrides_the_experiment_before_anything_starts(tmp_path, monkeypatch):
    from fxray.sweep.driver import validate

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    plan = validate(tune_args(tmp_path, "--set", "epochs=5", "--set", "sweep.grace_folds=2", "--set", "gamma=0.5"))
    assert plan.overrides == {"dqn.epochs": 5, "sweep.grace_folds": 2, "dqn.gamma": 0.5}
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "sets, message",
    [
        (["epochz=3"], "--set epochz: not a config field; known: "),
        (["lr=1e-3"], "--set dqn.lr: that field is searched (search: in "),
        (["bogus.x=1"], "--set bogus.x: bogus is not a section"),
        (["epochs"], "--set 'epochs': write KEY=VALUE"),
        (["epochs=many"], "dqn.epochs: 'many' must be"),
    ],
)
def test_a_bad_set_is_one_line_exit_2(tmp_path, monkeypatch, capsys, sets, message):
    from fxray import tune

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "tiny.yaml").write_text(TINY)
    argv = ["--experiment", str(tmp_path / "tiny.yaml"), "--storage", str(tmp_path / "run")]
    for s in sets:
        argv += ["--set", s]
    assert tune.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()


def test_tracking_uri_is_made_absolute_for_the_processes_it_starts(tmp_path, monkeypatch):
    from fxray import tune

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = tune.build_parser().parse_args(["--tracking-uri", "sqlite:///sweeps.db"])
    tune.apply_flags(args)
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'sweeps.db'}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")


def finished_run_dir(tmp_path) -> Path:
    """A finished sweep's run directory (what --resume reads before anything starts)."""
    storage = tmp_path / "old"
    storage.mkdir()
    (storage / "experiment.yaml").write_text(TINY)
    (storage / "sweep.json").write_text(
        json.dumps({"rounds": [{"name": "tune", "done": True, "finished": 1_800_000_000.0}]})
    )
    (storage / "results.json").write_text("{}")
    return storage


def test_resume_of_a_finished_sweep_says_so_and_touches_nothing(tmp_path, monkeypatch, capsys):
    from fxray import tune

    storage = finished_run_dir(tmp_path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in storage.iterdir()}
    monkeypatch.chdir(tmp_path)
    assert tune.main(["--storage", str(storage), "--resume"]) == 0
    out = capsys.readouterr()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_800_000_000.0))
    assert out.out.strip() == (
        f"nothing to resume: the sweep in {storage} finished at {when} "
        f"(results: {storage / 'results.json'}; run without --resume to extend it)"
    )
    assert out.err == ""
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in storage.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no mlflow.db, no runs/


def test_resume_of_a_finished_sweep_through_the_command_starts_no_ray(tmp_path):
    storage = finished_run_dir(tmp_path)
    t0 = time.time()
    out = run_py("tune", "--storage", storage, "--resume", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("nothing to resume: the sweep in "), out
    assert out.stderr == "" and time.time() - t0 < 30  # Ray's start alone takes ~10 s here
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


def test_bench_refuses_gpu_sizes_without_a_gpu():
    """scripts/bench.py on a CPU: --device cuda is one line and exit 2 (a plain run picks CPU sizes)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    out = run_py(
        code="import runpy, sys; sys.argv = ['bench.py', '--device', 'cuda']; "
        "runpy.run_path('scripts/bench.py', run_name='__main__')"
    )
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [
        "bench: error: --device cuda: no CUDA device here; drop --device (CPU sizes) or run on a GPU"
    ]


def test_a_replay_of_an_embedded_market_made_elsewhere_generates_it_again(tmp_path, monkeypatch):
    """--same-trials on a fresh machine: the results name the embedded market's cache file of
    the machine that ran the sweep; it is generated here from the experiment's spec and checked
    by its content hash (a market of other contents still fails, naming --data)."""
    from fxray.data import cache, synth
    from fxray.rl import experiment as expmod
    from fxray.sweep.driver import validate
    from fxray.sweep.rundir import UsageError, make_fold_dicts

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FXRAY_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tiny.yaml").write_text(TINY)
    exp = expmod.load(tmp_path / "tiny.yaml", "cpu", {})
    path = synth.ensure_default(exp.synth, log=lambda _: None)
    market = cache.open(str(path))
    results = {
        "trials": [
            {"trial_id": "t0", "sampled": {"lr": 1e-3}, "folds_done": 1, "folds": [{"timings": {"trial_start": 1}}]}
        ],
        "rounds": [{"seed": 0}],
        "profile": "cpu",
        "data": {"path": "/elsewhere/.cache/fxray/" + path.name, "content_hash": market.content_hash},
        "folds": make_fold_dicts(tmp_path / "tiny.yaml", exp, market),
        "base_config": exp.config.as_dict(),
    }
    path.unlink()  # this machine never had it
    (tmp_path / "given.json").write_text(json.dumps(results))
    plan = validate(tune_args(tmp_path, "--same-trials", str(tmp_path / "given.json"), "--profile", "cpu"))
    assert plan.data_path == str(path) and path.is_file()
    results["data"]["content_hash"] = "0" * 32  # what ran there is not what the spec makes here
    (tmp_path / "other.json").write_text(json.dumps(results))
    with pytest.raises(UsageError, match=r"ran on other data \(/elsewhere/.*: pass that file as --data$"):
        validate(tune_args(tmp_path, "--same-trials", str(tmp_path / "other.json"), "--profile", "cpu"))
