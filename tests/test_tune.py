"""The sweep CLI end to end, in subprocesses on a real local Ray, Optuna study and MLflow store.

Each CLI run starts its own Ray (about 10 s on a 2-core box) and runs a tiny config.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fxray.data.synth import SynthSpec, to_cache

# mlflow's sqlalchemy store warns about its own use of a deprecated loader; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

TINY = """\
name: t
data: {{synth: {{n_bars: {bars}, seed: 0}}}}
folds: {{train: 4d, val: 2d, test: 2d, max_folds: {folds}}}
dqn: {{num_envs: 16, batch_size: 64, hidden: 16, buffer_steps: 32, episode_len: 32,
      epochs: 2, steps_per_epoch: {steps}, patience: 2}}
search:
  lr: {{type: loguniform, low: 1.0e-4, high: 3.0e-3}}
  gamma: {{type: uniform, low: 0.8, high: 0.99}}
sweep: {{trials: {trials}, seed: 0, grace_folds: {grace}, reduction_factor: 2, cpu_per_trial: 0.25}}
"""


def setup(tmp_path, trials=4, steps=10, grace=2, folds=2, bars=20000):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY.format(trials=trials, steps=steps, grace=grace, folds=folds, bars=bars))
    env = {
        **os.environ,
        "FXRAY_CACHE_DIR": str(tmp_path / "cache"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("RAY_ADDRESS", None)
    return exp, env


def fault_env(env: dict, fault: str) -> None:
    """Workers of tests/faults.py, with `fault` (see there)."""
    here = str(Path(__file__).resolve().parent)
    env.update(
        FXRAY_WORKER_CLASS="faults:FaultyWorker",
        FXRAY_FAULT=fault,
        PYTHONPATH=os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p),
    )


def cli(args, env, cwd, timeout=300, **kw):
    cmd = [sys.executable, "-m", "fxray.tune", *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


def store(tmp_path):
    """(parent runs, child runs, MlflowClient) of experiment 't'."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("t")
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents, children, client


def study(tmp_path):
    from fxray.sweep.rounds import load_study

    return load_study(tmp_path / "runs/t")


def check_complete_sweep(tmp_path, n_trials):
    """Exactly one child run per trial with one val_sharpe point per fold; the study agrees."""
    parents, children, client = store(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent_id = parents[0].info.run_id
    assert len(children) == n_trials
    trial_ids = {r.data.tags["fxray.trial_id"] for r in children}
    assert len(trial_ids) == n_trials
    for run in children:
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent_id
        # one point per fold (fold_time_s: every fold logs it; a window Sharpe that is undefined is not logged)
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "fold_time_s")]
        assert sorted(steps) == [0, 1], steps
        assert {m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")} <= {0, 1}
        assert "lr" in run.data.params and run.data.params["epochs"] == "2"
        assert run.data.tags["fxray.dataset_hash"] and json.loads(run.data.tags["fxray.folds"])
        assert run.data.tags["fxray.seed"] == "0" and Path(run.data.tags["fxray.data_path"]).is_file()
    states = [t.state.name for t in study(tmp_path).trials]
    assert states == ["COMPLETE"] * n_trials, states
    results = json.loads((tmp_path / "runs/t/results.json").read_text())
    assert {t["trial_id"] for t in results["trials"]} == trial_ids
    by_id = {r.data.tags["fxray.trial_id"]: r for r in children}
    for t in results["trials"]:  # MLflow's summary (last point of the running mean) = results.json
        assert by_id[t["trial_id"]].data.metrics["mean_val_sharpe"] == pytest.approx(t["mean_val_sharpe"])
        assert by_id[t["trial_id"]].data.metrics["folds_done"] == 2
    assert all(t["folds_done"] == 2 for t in results["trials"])
    # the pooled verdict, with the keys scripts rely on
    keys = {"sharpe", "sharpe_se", "psr", "n_periods", "n_days", "n_trades", "turnover", "break_even_cost"}
    for t in results["trials"]:
        assert keys <= set(t["val"]) and keys <= set(t["test"])
    best = results["best"]
    assert keys <= set(best["val"]) and keys <= set(best["test"]) and "oracle_share" in best["test"]
    assert best["n_trials_counted"] == n_trials and "dsr" in best and best["walk_forward"]["n_periods"] > 0
    assert best["score"] == max(t["score"] for t in results["trials"] if t["folds_done"] == best["folds_done"])
    artifacts = {a.path for a in client.list_artifacts(parent_id)}
    assert {"experiment.yaml", "folds.csv", "equity.png", "best_checkpoint", "summary.md"} <= artifacts
    # the trials ranked as the last screen lists them, the best one named on the parent
    ranks = {r.data.tags["fxray.rank"]: r for r in children}
    assert sorted(ranks) == [f"{i:02d}" for i in range(1, n_trials + 1)]
    assert ranks["01"].data.tags["fxray.trial_id"] == results["best"]["trial_id"]
    assert parents[0].data.tags["fxray.best_run_id"] == ranks["01"].info.run_id
    assert "verdict:" in parents[0].data.tags["mlflow.note.content"]
    # the runs table's columns (the sweep's saved view) hold the last screen's numbers
    for t in results["trials"]:
        m = by_id[t["trial_id"]].data.metrics
        for w in ("val", "test"):  # a window with no trade has no Sharpe: no point (not a 0 that ranks)
            assert m.get(f"pooled_{w}_sharpe") == (None if t[w]["evidence"] == "none" else t[w]["sharpe"])
    view = client.get_experiment(parents[0].info.experiment_id).tags[f"mlflow.sharedViewState.{parent_id}"]
    assert "metrics.`pooled_test_sharpe`" in json.loads(json.loads(view)["state"])["selectedColumns"]
    return results


def sweep_report():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep_report", Path(__file__).parents[1] / "scripts/sweep_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain_replay(tmp_path, env) -> dict:
    """scripts/replay.py on the sweep's out.json: the same folds trained by a plain loop (no Ray,
    no Tune, no MLflow), on the CPU; its --json."""
    replay = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts/replay.py"), "out.json", "--device", "cpu"]
        + ["--json", "replay.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stderr[-3000:]
    return json.loads((tmp_path / "replay.json").read_text())


@pytest.mark.slow
def test_sweep_on_logical_gpus(tmp_path):
    exp, env = setup(tmp_path, trials=4)
    env["RAY_ADDRESS"] = "127.0.0.1:9"  # inherited, nothing there: no --address, so a local Ray all the same
    env["FXRAY_TUNE_DEBUG_LOG"] = str(tmp_path / "tune-debug.log")
    out = cli(["--experiment", exp, "--num-cpus", 2, "--num-gpus", 2, "--json", "out.json"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "GPU profile: 4 trials x 2 folds" in out.stdout
    # Tune's controller log went to the file, timestamped, and not to the console
    debug = (tmp_path / "tune-debug.log").read_text().splitlines()
    assert sum("Actor STARTED for trial" in line for line in debug) >= 1
    assert all(float(line.split(" ", 1)[0]) > 1e9 for line in debug if line)
    assert "Actor STARTED" not in out.stdout + out.stderr
    assert out.stdout.count(" fold 2/2: ") == 4 and "top 4 of 4 trials" in out.stdout
    assert "mlflow ui --backend-store-uri" in out.stdout
    assert "the trials, ranked:" in out.stdout and "#/experiments/" in out.stdout
    # the libraries' noise is kept out without --verbose (fxray/sweep/logs.py)
    noises = ("Token authentication", "core_worker.cc", "A new study created", "Creating initial MLflow")
    for noise in (*noises, "save not implemented for Searcher"):
        assert noise not in out.stderr and noise not in out.stdout, noise
    results = check_complete_sweep(tmp_path, 4)
    assert json.loads((tmp_path / "out.json").read_text()) == results
    # the screen ends with the market, the chosen trial beside the oracle and the ridge rule, the
    # verdict's sentence, then where MLflow shows it and the command to run next; "best" nowhere
    b, lines = results["best"], out.stdout.splitlines()
    assert results["data"]["embedded"] and results["data"]["synth"]["seed"] == 0
    end = lines.index(next(line for line in lines if line.startswith("results: ")))
    assert lines[end - 3] == "market:  the embedded synthetic market (seed 0, 20,000 1min bars; a planted flow edge)"
    test, refs = b["test"], b["baselines"]
    assert lines[end - 2] == (
        f"chosen:  trial-{b['trial_id']}, pooled test Sharpe {test['sharpe']:+.2f} ± {test['sharpe_se']:.2f} over "
        f"{test['n_days']} test days; oracle {refs['oracle']['sharpe']:+.2f} ± {refs['oracle']['sharpe_se']:.2f}, "
        f"ridge rule {refs['ridge']['sharpe']:+.2f} ± {refs['ridge']['sharpe_se']:.2f} on the same days"
    )
    assert lines[end - 1] == "verdict: " + results["verdict"]["sentence"]
    assert out.stdout.count(results["verdict"]["sentence"]) == 1
    assert lines[-1].startswith(f"next:    fxray compare t --tracking-uri {env['MLFLOW_TRACKING_URI']}   # ")
    assert "best" not in out.stdout.lower()
    workers = results["workers"]
    assert len(workers) == 2 and all(w["n_loads"] == 1 and not w["restarted"] for w in workers)
    assert sorted(w["gpu_ids"][0] for w in workers) == ["0", "1"]
    assert {w["device"] for w in workers} == {"cpu"}  # logical GPUs: the hardware decides
    assert sum(w["n_calls"] for w in workers) == 4 * 2
    assert results["best"]["mean_val_sharpe"] == max(t["mean_val_sharpe"] for t in results["trials"])
    # every worker warmed up once and logged each fold it served; the report accounts for all the wall
    for w in workers:
        assert [c[4] for c in w["calls"]].count("warmup") == 1
        assert sum(c[4] != "warmup" for c in w["calls"]) == w["n_calls"]
    assert {"ray_up", "workers_created", "workers_ready"} <= results["phases"].keys()
    for w in workers:  # the start-up steps of each worker, in order, before its warmup
        steps = [w["timeline"][k] for k in ("init", "imported", "loaded")]
        assert steps == sorted(steps) and steps[-1] <= w["calls"][0][0]
    split = sweep_report().report(str(tmp_path / "out.json"))
    shares = [split[f"{k}_share"] for k in ("training", "cancelled", "warmup", "startup", "within", "between", "tail")]
    assert sum(shares) == pytest.approx(1.0) and split["training_share"] > 0
    assert {"t_tune_started", "t_mlflow_ready", "t_worker_loaded", "t_workers_warm"} <= split.keys()
    assert split["t_worker_init"] <= split["t_worker_imported"] <= split["t_worker_loaded"] < split["t_workers_warm"]
    tb = results["time_breakdown"]  # where the wall went (docs/tune.md): six parts adding up to it
    parts = [tb[f"{k}_s"] for k in ("startup", "fold_setup", "learner", "backtest", "overhead", "idle")]
    assert min(parts) >= 0 and tb["learner_s"] > 0 and sum(parts) == pytest.approx(results["wall_s"], rel=0.05)
    # the same folds trained by a plain loop (no Ray, no Tune, no MLflow) give the same val Sharpe
    plain = plain_replay(tmp_path, env)
    assert plain["folds"] == 8 and plain["val_sharpe_matched"] == 8 and plain["val_sharpe_max_abs_diff"] == 0.0
    assert 0 < plain["ideal_wall_s"] < plain["sweep_wall_s"] and 0 < plain["overhead_share"] < 1


@pytest.mark.slow
def test_asha_stops_waste_no_fold(tmp_path):
    """3 folds, grace 2: ASHA may stop a trial after its second fold (or ends it after the
    third). The first two folds run back to back on one lease, the second queued while the
    first is reported; before the second's report the trial frees its worker instead of
    queueing the third, so a stopped trial leaves no cancelled fold behind, and a trial
    that goes on leases a worker again for its third."""
    exp, env = setup(tmp_path, trials=8, folds=3, bars=26000)
    out = cli(["--experiment", exp, "--num-cpus", 2, "--json", "out.json"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    done = [t["folds_done"] for t in results["trials"]]
    assert len(done) == 8 and 2 in done and 3 in done, done  # some stopped at the rung, some went on
    stopped = sum(t["stopped_early"] for t in results["trials"])
    assert results["asha"]["rungs"] == [2] and results["asha"]["stopped_per_rung"] == [stopped]
    assert f"ASHA stopped trials at its rungs: {stopped} at fold 2; {done.count(3)} of 8 ran all 3 folds" in out.stdout
    calls = [c for w in results["workers"] for c in w["calls"] if c[4] != "warmup"]
    assert [c[4] for c in calls].count("cancelled") == 0
    assert len(calls) == sum(done)  # every fold a worker started was one a trial reported
    parents, children, _ = store(tmp_path)
    assert len(parents) == 1 and len(children) == 8
    # --same-trials: the same 8 configs again, each for the folds it trained above (no ASHA),
    # enqueued in the order they started; on the CPU every fold gives the same val Sharpe
    out = cli(
        [
            "--experiment",
            exp,
            "--num-cpus",
            2,
            "--same-trials",
            "out.json",
            "--storage",
            "again",
            "--json",
            "again.json",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CPU profile: 8 trials x 3 folds" in out.stdout and "-- the trials of " in out.stdout
    assert f"/{sum(done)} folds " in out.stdout  # the progress line counts the folds it will train
    again = json.loads((tmp_path / "again.json").read_text())

    def per_config(res):
        return {
            json.dumps(t["sampled"], sort_keys=True): [f["val"]["sharpe"] for f in t["folds"]] for t in res["trials"]
        }

    assert per_config(again) == per_config(results) and len(per_config(again)) == 8
    pair = sweep_report().speedup(str(tmp_path / "out.json"), str(tmp_path / "again.json"))
    assert pair["same_work"] and pair["folds_a"] == pair["folds_b"] == sum(done)
    assert pair["val_sharpe_max_abs_diff"] == 0.0 and pair["speedup"] > 0
    from fxray.sweep.rounds import load_study
    from fxray.sweep.rundir import read_same_trials

    started = [sampled for sampled, _ in read_same_trials(str(tmp_path / "out.json"))["trials"]]
    replayed = load_study(tmp_path / "again")
    assert [t.params for t in replayed.trials] == started
    calls = [c for w in again["workers"] for c in w["calls"] if c[4] != "warmup"]
    assert len(calls) == sum(done) and [c[4] for c in calls].count("cancelled") == 0
    assert again["rounds"][0]["same_trials"]["from"] == str(tmp_path / "out.json")
    parents, children, _ = store(tmp_path)
    assert len(parents) == 2 and len(children) == 16
    assert sorted(p.data.tags.get("fxray.same_trials", "") for p in parents) == ["", str(tmp_path / "out.json")]


def test_a_sweep_that_abstains_on_every_fold_trains_nothing_and_reports_a_flat_policy(tmp_path):
    """dqn.abstain with a screen nothing passes: no fold is trained, each trial's policy is flat
    (its zero returns pooled and scored), and the vote of the full trials counts them as flat
    members, where their missing checkpoints would otherwise skip it."""
    exp, env = setup(tmp_path, trials=3)
    args = [
        "--experiment",
        exp,
        "--num-cpus",
        2,
        "--set",
        "screen_t=100",
        "--set",
        "abstain=true",
        "--json",
        "out.json",
    ]
    out = cli(args, env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    folds = [f for t in results["trials"] for f in t["folds"]]
    assert len(folds) == 3 * 2 and all(f["status"] == "ok" and f["epochs"] == 0 and not f["checkpoint"] for f in folds)
    assert not list((tmp_path / "runs/t/checkpoints").rglob("*.safetensors"))  # no weights: a marker a fold
    assert len(list((tmp_path / "runs/t/checkpoints").rglob("fold*.abstained.json"))) == 3 * 2
    best = results["best"]
    assert best["test"]["n_trades"] == 0 and best["test"]["sharpe"] == 0.0 and best["test"]["n_periods"] > 0
    assert "screened" in best["baselines"]  # the references beside it, as for any policy
    vote = results["ensemble"]
    assert "skipped" not in vote and vote["n_members"] == 3 and vote["test"]["n_trades"] == 0
    parents, children, _ = store(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(children) == 3


@pytest.mark.slow
def test_worker_crash_then_extend(tmp_path):
    exp, env = setup(tmp_path, trials=3)
    # the file through a base: chain: the extension below runs from the sweep's copy of it
    (tmp_path / "base").mkdir()
    exp.rename(tmp_path / "base/tiny.yaml")
    exp.write_text("base: base/tiny.yaml\nname: t\n")
    fault_env(env, "0:2")  # worker 0 exits hard in the middle of its 2nd fold
    out = cli(["--experiment", exp, "--num-cpus", 2], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Unhandled error" not in out.stderr, out.stderr[-3000:]
    assert "CPU profile: 3 trials x 2 folds" in out.stdout
    results = check_complete_sweep(tmp_path, 3)
    crashed = results["workers"][0]
    assert crashed["restarted"] and crashed["n_loads"] == 1  # the new process loaded once too
    # The sweep finished: running it again adds a round of trials to the same study and parent run.
    del env["FXRAY_WORKER_CLASS"], env["FXRAY_FAULT"]
    out = cli(["--experiment", exp, "--num-cpus", 2, "--trials", 1], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = check_complete_sweep(tmp_path, 4)
    assert [r["name"] for r in results["rounds"]] == ["tune", "tune-2"]


def failed_sweep(tmp_path, env, exp) -> str:
    """Run a sweep that must fail once started: exit 1, one error line (returned), the resume hint."""
    out = cli(["--experiment", exp, "--num-cpus", 2], env, tmp_path, timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("fxray.tune: error:")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert "--resume" in out.stderr
    return errors[0]


@pytest.mark.slow
def test_a_worker_that_cannot_load_stops_the_sweep(tmp_path):
    exp, env = setup(tmp_path, trials=3)
    fault_env(env, "1:load")  # worker 1's constructor raises
    error = failed_sweep(tmp_path, env, exp)
    assert "could not load the data" in error and "injected load failure" in error


@pytest.mark.slow
def test_a_trial_that_fails_is_one_line_not_a_traceback(tmp_path):
    """A fold that raises (here ENOSPC, as a checkpoint on a full disk): each failure of the trial
    is one line naming the cause (Tune's ~80-line traceback and Ray's 'Unhandled error' dump at
    exit are off), the sweep ends exit 1 saying --resume retries it."""
    exp, env = setup(tmp_path, trials=1)
    fault_env(env, "disk:1")
    out = cli(["--experiment", exp, "--num-cpus", 2], env, tmp_path, timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr + out.stdout and "Unhandled error" not in out.stderr, out.stderr[-3000:]
    failed = [line for line in out.stdout.splitlines() if " failed: " in line]
    assert len(failed) == 3 and all("No space left on device (injected" in line for line in failed), failed
    assert failed[0].endswith("Tune starts it again") and failed[-1].endswith("--resume retries it")
    assert "1 trial(s) failed" in out.stderr and "--resume retries them" in out.stderr


def refused_before_ray(tmp_path, env, exp) -> str:
    """A sweep refused before anything starts: exit 2, one line (returned), nothing written."""
    out = cli(["--experiment", exp, "--num-cpus", 2], env, tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fxray.tune: error:"), out.stderr[-3000:]
    assert not (tmp_path / "runs").exists()
    return lines[0]


def test_an_mlflow_store_that_is_not_a_database_is_refused_before_ray(tmp_path):
    exp, env = setup(tmp_path, trials=3)
    (tmp_path / "mlflow.db").write_bytes(b"not a sqlite file" * 100)
    error = refused_before_ray(tmp_path, env, exp)
    assert "mlflow.db is not an SQLite database" in error


def test_an_mlflow_server_that_cannot_be_reached_is_refused_before_ray(tmp_path):
    """A tracking server may take minutes to fail while MLflow retries: one look, before Ray."""
    exp, env = setup(tmp_path, trials=3)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env.update(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}")
    error = refused_before_ray(tmp_path, env, exp)
    assert f"MLFLOW_TRACKING_URI http://127.0.0.1:{port}: no tracking server answers there" in error


def interrupt_after_a_fold(args, env, cwd) -> str:
    """Run the CLI, press Ctrl+C once its first fold is in folds.jsonl (Tune saves its
    state and stops); check it exited 130 and return its stderr."""
    cmd = [sys.executable, "-m", "fxray.tune", *map(str, args)]
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folds = cwd / "runs/t/folds.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and not (folds.exists() and folds.read_text().count("\n") >= 1):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    return err


@pytest.mark.slow
def test_interrupt_then_resume(tmp_path):
    exp, env = setup(tmp_path, trials=4, steps=60, bars=24000)  # folds of ~1 s: Ctrl+C lands mid-sweep
    with exp.open("a") as f:  # the CPU profile's market is not the GPU profile's
        f.write("cpu:\n  data: {synth: {n_bars: 20000, seed: 0}}\n")
    err = interrupt_after_a_fold(["--experiment", exp, "--num-cpus", 2], env, tmp_path)
    assert "--resume" in err and "Tuner.restore" not in err  # Tune's own advice would load its pickles
    folds = tmp_path / "runs/t/folds.jsonl"
    sweep = json.loads((tmp_path / "runs/t/sweep.json").read_text())
    assert not sweep["rounds"][-1]["done"]
    again = cli(["--experiment", exp], env, tmp_path)  # not resumed: refused, nothing touched
    assert again.returncode == 2 and "pass --resume" in again.stderr
    assert (tmp_path / "runs/t/sweep.json").read_text() == json.dumps(sweep, indent=1)
    shutil.rmtree(tmp_path / "cache")  # resumed on a fresh machine: the embedded market is made again
    out = cli(["--experiment", exp, "--num-cpus", 2, "--resume"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "generating the default synthetic market (20,000 bars" in out.stdout  # the profile's that ran
    check_complete_sweep(tmp_path, 4)
    # a resumed trial continues after its last reported fold: no fold is trained twice
    assert folds.read_text().count("\n") == 4 * 2
    # --resume once more: the sweep finished, so it says so, exit 0, before Ray, touching nothing
    run_dir = tmp_path / "runs/t"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    (parent,), _, client = store(tmp_path)
    t0 = time.time()
    done = cli(["--experiment", exp, "--resume"], env, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert done.stdout.startswith(f"nothing to resume: the sweep in {run_dir} finished at "), done.stdout
    assert "profile" not in done.stdout and time.time() - t0 < 30
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    again = client.get_run(parent.info.run_id)
    assert again.data.metrics == parent.data.metrics and again.info.end_time == parent.info.end_time


@pytest.mark.slow
def test_same_trials_interrupted_then_resumed(tmp_path):
    """A --same-trials sweep of populations (two trials a worker) stopped by Ctrl+C resumes with
    what it started with: the given configs, each for its given folds, none trained twice."""
    exp, env = setup(tmp_path, trials=4, steps=60)  # folds of ~1 s: Ctrl+C lands mid-sweep
    given = [
        ({"lr": 1e-3, "gamma": 0.9}, 2),
        ({"lr": 2e-4, "gamma": 0.85}, 1),
        ({"lr": 5e-4, "gamma": 0.95}, 2),
        ({"lr": 3e-3, "gamma": 0.8}, 1),
    ]
    (tmp_path / "given.json").write_text(json.dumps(hand_made_results(tmp_path, exp, given)))
    given_run = ["--experiment", exp, "--num-cpus", 2, "--population", 2, "--same-trials", "given.json"]
    interrupt_after_a_fold(given_run, env, tmp_path)
    folds = tmp_path / "runs/t/folds.jsonl"
    out = cli(
        ["--storage", "runs/t", "--num-cpus", 2, "--population", 2, "--resume", "--json", "out.json"], env, tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert sorted((json.dumps(t["sampled"], sort_keys=True), t["folds_done"]) for t in results["trials"]) == sorted(
        (json.dumps(c, sort_keys=True), n) for c, n in given
    )
    assert folds.read_text().count("\n") == 6  # every given fold once
    assert [t.state.name for t in study(tmp_path).trials] == ["COMPLETE"] * 4


BAD = {
    "unknown key": (["--experiment", "bad.yaml"], "bad.yaml: dqn.epochz: unknown key"),
    "bad range": (["--experiment", "range.yaml"], "range.yaml: search.lr.low: 0 must be > 0"),
    "missing data": (["--experiment", "tiny.yaml", "--data", "nope.fxcache"], "--data: nope.fxcache does not exist"),
    "not an fxcache": (["--experiment", "tiny.yaml", "--data", "junk.fxcache"], "junk.fxcache: not an Arrow IPC"),
    "data too short": (["--experiment", "long.yaml", "--data", "short.fxcache"], "long.yaml: folds: data too short"),
    "missing file": (["--experiment", "nope.yaml"], "nope.yaml: no such experiment file"),
    "nothing to resume": (["--experiment", "tiny.yaml", "--resume"], "no sweep to resume"),
    "dead address": (["--experiment", "tiny.yaml", "--address", "127.0.0.1:1"], "nothing answers there"),
    "address and local sizes": (
        ["--experiment", "tiny.yaml", "--address", "auto", "--num-cpus", "2"],
        "--num-cpus/--num-gpus size a local Ray",
    ),
    "bad flag": (["--experiment", "tiny.yaml", "--trials", "0"], "argument --trials: '0' is not an integer >= 1"),
    "MLflow folder missing": (["--experiment", "tiny.yaml"], "is not a writable folder"),
    "same trials: no file": (
        ["--experiment", "tiny.yaml", "--same-trials", "nope.json"],
        "--same-trials nope.json: no such file",
    ),
    "same trials: not results": (
        ["--experiment", "tiny.yaml", "--same-trials", "tiny.yaml"],
        "--same-trials tiny.yaml: not a sweep's results.json",
    ),
    "same trials: other data": (["--experiment", "tiny.yaml", "--same-trials", "other-data.json"], "ran on other data"),
    "same trials: other folds": (
        ["--experiment", "tiny.yaml", "--same-trials", "other-folds.json"],
        "not the same folds as t here (cpu profile): pass the --experiment it ran",
    ),
    "same trials: other config": (
        ["--experiment", "tiny.yaml", "--same-trials", "other-config.json"],
        "not the same dqn config as t here",
    ),
    "same trials: two rounds": (
        ["--experiment", "tiny.yaml", "--same-trials", "two-rounds.json"],
        "that sweep ran 2 rounds",
    ),
    "same trials and --trials": (
        ["--experiment", "tiny.yaml", "--same-trials", "same.json", "--trials", "3"],
        "--trials 3: --same-trials runs the trials of same.json (1); drop --trials",
    ),
    "same trials into a sweep": (
        ["--experiment", "tiny.yaml", "--same-trials", "same.json", "--storage", "old"],
        "--same-trials starts a new sweep and ",
    ),
    "same trials on resume": (
        ["--same-trials", "same.json", "--storage", "old", "--resume"],
        "--same-trials: drop it with --resume",
    ),
    "same trials, other profile": (
        ["--experiment", "tiny.yaml", "--same-trials", "same.json", "--profile", "gpu"],
        "same.json ran the cpu profile; drop --profile",
    ),
}


def bad_inputs(tmp_path):
    exp, env = setup(tmp_path)
    (tmp_path / "bad.yaml").write_text(exp.read_text().replace("epochs: 2", "epochz: 2"))
    (tmp_path / "range.yaml").write_text(exp.read_text().replace("low: 1.0e-4", "low: 0"))
    (tmp_path / "long.yaml").write_text(exp.read_text().replace("train: 6d", "train: 60d"))
    (tmp_path / "junk.fxcache").write_bytes(b"not arrow" * 100)
    if not (tmp_path / "short.fxcache").exists():
        to_cache(SynthSpec(n_bars=3000, seed=0), tmp_path / "short.fxcache")
    same_trials_files(tmp_path, exp)
    return env


def hand_made_results(tmp_path, exp, trials) -> dict:
    """A results.json as a finished sweep of `exp` on a 20k-bar market would write it, with
    `trials` = [(sampled config, folds done)], started in that order: what --same-trials reads."""
    from fxray.data import cache
    from fxray.data.folds import make_folds
    from fxray.rl import experiment

    data = tmp_path / "t20k.fxcache"
    if not data.exists():
        to_cache(SynthSpec(n_bars=20000, seed=0), data)
    market, e = cache.open(data), experiment.load(exp, "cpu")
    return {
        "profile": "cpu",
        "rounds": [{"seed": 0}],
        "base_config": e.config.as_dict(),
        "data": {"path": str(data), "content_hash": market.content_hash},
        "folds": [f.as_dict() for f in make_folds(market.ts, e.folds)],
        "trials": [
            {
                "trial_id": f"t{i}",
                "sampled": sampled,
                "folds_done": n,
                "folds": [{"timings": {"trial_start": float(i)}}] * n,
            }
            for i, (sampled, n) in enumerate(trials)
        ],
    }


def same_trials_files(tmp_path, exp):
    """--same-trials inputs: a one-trial results.json that matches tiny.yaml (same.json)
    and copies that differ from it in one thing each."""
    same = hand_made_results(tmp_path, exp, [({"lr": 1e-3, "gamma": 0.9}, 1)])
    variants = {
        "same": {},
        "other-data": {"data": {**same["data"], "content_hash": "0" * 16}},
        "other-folds": {"folds": same["folds"][:1]},
        "other-config": {"base_config": {**same["base_config"], "epochs": 3}},
        "two-rounds": {"rounds": [{"seed": 0}, {"seed": 1}]},
    }
    for name, change in variants.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({**same, **change}))
    (tmp_path / "old").mkdir(exist_ok=True)  # a finished sweep's run directory
    (tmp_path / "old/experiment.yaml").write_text(exp.read_text())
    (tmp_path / "old/sweep.json").write_text(json.dumps({"rounds": [{"done": True}]}))


def assert_nothing_written(tmp_path):
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, case):
    """In-process through main(argv): every refusal happens before Ray or MLflow start."""
    from fxray.tune import main

    env = bad_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(
        "MLFLOW_TRACKING_URI",
        env["MLFLOW_TRACKING_URI"]
        if case != "MLflow folder missing"
        else f"sqlite:///{tmp_path / 'nope' / 'mlflow.db'}",
    )
    args, expected = BAD[case]
    if case == "bad flag":  # argparse exits 2 itself, after its usage line
        with pytest.raises(SystemExit, match="2"):
            main(args)
    else:
        assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert expected in lines[-1], lines
    if case != "bad flag":
        assert len(lines) == 1
    assert_nothing_written(tmp_path)


def test_bad_input_through_the_real_cli(tmp_path):
    env = bad_inputs(tmp_path)
    out = cli(["--experiment", "bad.yaml"], env, tmp_path, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert (
        out.stderr.strip()
        == "fxray.tune: error: " + "bad.yaml: dqn.epochz: unknown key; known: " + out.stderr.split("known: ")[1].strip()
    )
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize("quiet", [False, True])
def test_a_process_ending_inside_a_callback_is_not_a_traceback(quiet):
    """A SIGTERM that Ray's handler turns into SystemExit inside a callback Python cannot raise
    from (a weakref's, a __del__: here a __del__) prints "Exception ignored ... Traceback", which
    Ray forwards to the sweep's stderr; quiet_exit (trial and worker processes) drops that one
    case, and any other unraisable exception is still printed."""
    code = (
        "import sys\nfrom fxray.sweep.logs import quiet_exit\n"
        f"if {quiet}: quiet_exit()\n"
        "class Ending:\n    def __del__(self): raise SystemExit(1)\n"
        "class Broken:\n    def __del__(self): raise ValueError('a real bug')\n"
        "Ending(); Broken(); print('alive')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "alive\n", out.stderr
    assert ("Ending.__del__" in out.stderr) is not quiet and "ValueError: a real bug" in out.stderr


@pytest.mark.parametrize("kept_out", [True, False])
def test_tunes_callback_telemetry_does_not_import_mlflow_into_the_driver(kept_out):
    """Tuner.fit counts the run's callbacks by class, importing Ray's MLflow integration,
    which imports mlflow itself; keep_mlflow_out_of_tune stops that (and only that)."""
    code = (
        "import sys, fxray.tune, fxray.sweep.tuner\n"
        f"if {kept_out}: fxray.sweep.tuner.keep_mlflow_out_of_tune()\n"
        "from ray.air._internal.usage import _count_callbacks\n"
        "from ray.tune.logger import CSVLoggerCallback\n"
        "print(dict(_count_callbacks([CSVLoggerCallback()])), 'mlflow' in sys.modules)\n"
        "import mlflow\n"  # still importable normally afterwards
        "print(mlflow.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    counted, imported = out.stdout.splitlines()[-2].rsplit(" ", 1)
    assert counted == "{'CSVLoggerCallback': 1}" and imported == str(not kept_out)
    assert out.stdout.splitlines()[-1] == "mlflow"


def test_the_driver_start_up_path_imports_no_torch_scipy_or_mlflow():
    """The driver's serial start-up must not pay for them (seconds each on the GPU
    machines): torch lives in the FoldWorkers, mlflow in the writer (fxray.track.writer)."""
    code = (
        "import sys, fxray.tune, fxray.sweep.callbacks, fxray.sweep.driver\n"
        "from fxray.track import writer, runs as mlruns\nfrom fxray.data import synth\n"
        "synth.default_path(synth.SynthSpec()); mlruns.tracking_uri()\n"
        "print(sorted({'torch', 'scipy', 'mlflow'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


# --- populations (sweep.population, --population K: fxray.sweep.gather) ------------------------


@pytest.mark.slow
def test_a_population_sweep_logs_every_config_once_with_what_it_trains_alone(tmp_path):
    """--population 4 on one CPU worker, no rung before the last fold: the searcher asks the 4
    trials at once and queues their folds on the worker (before Tune starts a process), a
    process per core collects them in turn (Tune reuses it), one MLflow child run per config,
    every fold trained and logged once, and every fold's val Sharpe what the plain
    one-config-at-a-time loop gives, to the bit."""
    exp, env = setup(tmp_path, trials=4)  # 2 folds, grace 2: ASHA cannot stop a trial before its last
    args = ["--experiment", exp, "--num-cpus", 2, "--cpu-workers", 1, "--population", 4, "--json", "out.json"]
    out = cli(args, {**env, "FXRAY_TUNE_DEBUG_LOG": str(tmp_path / "tune.log")}, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "populations of up to 4" in out.stdout
    results = check_complete_sweep(tmp_path, 4)
    (w,) = results["workers"]
    # the searcher asked the worker for every fold of every trial; Ray orders no calls across callers,
    # so a trial's own call may come first (that fold is then not queued: tests/test_workers.py)
    assert w["n_asked"] == w["n_calls"] == 4 * 2 and 0 <= w["n_asked_collected"] <= 4 * 2
    # every fold through the worker's populations, once (and its warm-up, which Ray may deliver late)
    assert 4 * 2 <= sum(w["populations"]) <= 4 * 2 + 1
    assert all(1 <= size <= 4 for size in w["populations"])
    assert all(1 <= f["population"] <= 4 for t in results["trials"] for f in t["folds"])
    # the 4 trials ran in at most as many processes as this machine has cores (Tune's own log)
    actors = (tmp_path / "tune.log").read_text().count("Actor STARTED")
    assert 1 <= actors <= min(4, os.cpu_count()), actors
    split = sweep_report().report(str(tmp_path / "out.json"))  # device time counted once per population
    shares = [split[f"{k}_share"] for k in ("training", "cancelled", "warmup", "startup", "within", "between", "tail")]
    assert sum(shares) == pytest.approx(1.0) and 0 < split["training_share"] < 1
    assert sum(split["population_sizes"]) == 4 * 2
    plain = plain_replay(tmp_path, env)  # each config trained alone by a plain loop: the same val Sharpe
    assert plain["folds"] == 8 and plain["val_sharpe_matched"] == 8 and plain["val_sharpe_max_abs_diff"] == 0.0
