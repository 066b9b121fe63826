"""fxray.rl.ensemble: S seeds of one config as one population, scored as their mean-Q policy.

The reference is independent of the population: each seed trained alone by the Trainer, its
kept weights' Q-values on the window averaged by hand and backtested."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from test_population import BASE, market_data  # noqa: F401 (a fixture)

from fxray.eval.backtest import backtest
from fxray.rl.ensemble import EnsembleTrainer, make_trainer, member_seeds
from fxray.rl.trainer import FoldResult, Trainer
from fxray.sweep.gather import Gatherer
from fxray.track.records import FoldRecord

CFG = BASE.replace(epochs=3, seeds=3)


def alone_reference(data, fold, cfg, seed):
    """Each member seed alone (Trainer), then the mean of their Q on val and test, backtested."""
    q = {"val": [], "test": []}
    singles = []
    for s in member_seeds(seed, cfg.seeds):
        trainer = Trainer(data, cfg.replace(seeds=1))
        singles.append(trainer.run_fold(fold, s))
        for w in q:  # the trainer ends a fold holding its kept weights
            q[w].append(trainer.q_all(getattr(fold, w)))
    data.set_fold(fold)
    out = {
        w: backtest(torch.stack(q[w]).mean(0), data.window(getattr(fold, w), cfg.fill), cfg.cost)
        for w in ("val", "test")
    }
    return singles, out


def test_the_ensemble_is_the_mean_q_policy_of_its_seeds_each_trained_as_alone(market_data):  # noqa: F811
    data, fold = market_data
    result = make_trainer(data, CFG).run_fold(fold, seed=4)
    singles, ref = alone_reference(data, fold, CFG, 4)
    assert result.status == "ok" and result.checkpoint is None
    assert result.val == ref["val"].metrics.__dict__ and result.test == ref["test"].metrics.__dict__
    assert result.val_periods == ref["val"].periods.as_dict() and result.test_periods == ref["test"].periods.as_dict()
    spread = result.seed_spread
    assert spread["seeds"] == [4, 4 + 7919, 4 + 2 * 7919] and spread["status"] == ["ok"] * 3
    assert spread["val_sharpe"] == [s.val["sharpe"] for s in singles]
    assert spread["test_sharpe"] == [s.test["sharpe"] for s in singles]
    assert len(set(spread["test_sharpe"])) == 3  # three different seeds, not one three times
    # the record: the ensemble's numbers, the seeds' spread beside them, logged to MLflow
    rec = FoldRecord.from_result(result.as_dict())
    assert rec.seeds == 3 and rec.seed_test_sharpe == spread["test_sharpe"]
    assert abs(rec.seed_test_sharpe_std - torch.tensor(spread["test_sharpe"], dtype=torch.float64).std().item()) < 1e-9
    assert "seed_test_sharpe_std" in rec.mlflow_metrics() and rec.test["sharpe"] == result.test["sharpe"]


def test_one_seed_is_the_trainer_and_a_stopped_ensemble_is_cancelled(market_data):  # noqa: F811
    data, fold = market_data
    assert type(make_trainer(data, CFG.replace(seeds=1))) is Trainer
    stopped = EnsembleTrainer(data, CFG).run_fold(fold, seed=0, stop=lambda: True)
    assert stopped.status == "cancelled" and stopped.seed_spread["status"] == ["cancelled"] * 3


def test_a_worker_trains_an_ensemble_as_a_population_of_its_own(market_data):  # noqa: F811
    """Through the Gatherer (a population sweep's worker): the ensemble request is not mixed
    with a plain request of the same fold, and each gets what it gets alone."""
    data, fold = market_data
    gatherer = Gatherer(data, k_max=4, wait_s=0.5, pad=False)
    plain = CFG.replace(seeds=1, lr=2e-3)
    out = {}

    def call(name, cfg, seed):
        out[name] = gatherer.train(cfg.as_dict(), fold.as_dict(), seed)

    threads = [threading.Thread(target=call, args=a) for a in (("ens", CFG, 4), ("plain", plain, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(gatherer.sizes) == [1, 1]
    alone = EnsembleTrainer(data, CFG).run_fold(fold, seed=4).as_dict()
    for key in ("status", "val", "test", "val_periods", "test_periods", "seed_spread"):
        assert out["ens"][key] == alone[key], key
    single = Trainer(data, plain).run_fold(fold, 1)
    assert FoldResult(**{k: v for k, v in out["plain"].items() if k != "population"}).test == single.test


def test_train_cli_with_seeds_reports_the_ensemble_and_its_seeds(tmp_path, synth_cache, short_folds_experiment):
    j = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "fxray.train", "--experiment", str(short_folds_experiment), "--data", str(synth_cache)]
    cmd += ["--device", "cpu", "--epochs", "2"]
    cmd += ["--folds", "1", "--set", "steps_per_epoch=20", "--set", "hidden=16", "--set", "seeds=2"]
    ckpt = tmp_path / "ckpt"
    p = subprocess.run(
        [*cmd, "--json", str(j), "--checkpoint-dir", str(ckpt)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(j.read_text())
    assert r["config"]["seeds"] == 2 and r["config"]["inputs"] == "ridge"  # the experiment's front end
    (fold,) = r["folds"]
    assert len(fold["seed_spread"]["test_sharpe"]) == 2 and fold["status"] == "ok"
    # each member's kept weights, checkpointed: the exported bundle is the policy this fold scored
    (seed_dir,) = ckpt.iterdir()
    k = fold["fold"]["k"]
    assert sorted(q.name for q in seed_dir.glob("*.safetensors")) == [
        f"fold{k}.m0.safetensors",
        f"fold{k}.m1.safetensors",
    ]
    meta = json.loads((seed_dir / f"fold{k}.m1.json").read_text())
    assert meta["ensemble"]["member"] == 1 and meta["ensemble"]["val_score"] == fold["val_score"]
    assert meta["test"]["sharpe"] == fold["seed_spread"]["test_sharpe"][1]  # the member's own, beside the ensemble's
    bundle, bt = tmp_path / "policy", tmp_path / "bt.json"
    run = [sys.executable, "-m", "fxray.export", str(seed_dir), "--data", str(synth_cache), "--out", str(bundle)]
    p = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [m["name"] for m in manifest["members"]] == [f"fold{k}_0", f"fold{k}_1"]
    assert [Path(m["checkpoint"]).name for m in manifest["members"]] == [
        f"fold{k}.m0.safetensors",
        f"fold{k}.m1.safetensors",
    ]
    run = [sys.executable, "-m", "fxray.backtest", "--policy", str(bundle), "--data", str(synth_cache)]
    run += ["--window", "test", "--engine", "torch", "--device", "cpu", "--json", str(bt)]
    p = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(bt.read_text())["policy"]["metrics"]
    assert got["n_trades"] == fold["test"]["n_trades"] > 0
    assert got["sharpe"] == pytest.approx(fold["test"]["sharpe"], rel=1e-6)


def test_export_of_an_ensemble_run_says_why_in_one_line(tmp_path):
    """A seed ensemble's trial run from before its members were checkpointed: export stops with
    one line that says how to get them, and writes nothing."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("t")
    parent = client.create_run(exp)
    tags = {"fxray.trial_id": "0000", "fxray.storage": str(tmp_path / "run"), "fxray.dataset_hash": "0" * 32}
    run = client.create_run(exp, tags={**tags, "mlflow.parentRunId": parent.info.run_id})
    client.log_param(run.info.run_id, "seeds", "3")
    client.set_terminated(run.info.run_id)
    cmd = [sys.executable, "-m", "fxray.export", run.info.run_id, "--tracking-uri", uri, "--out", str(tmp_path / "o")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "a seed ensemble (seeds = 3) whose members wrote no checkpoints" in lines[0]
    assert "--checkpoint-dir DIR" in lines[0]
    assert not (tmp_path / "o").exists()


def test_the_summary_reports_the_seeds_of_the_best_trials_ensemble():
    from fxray.track.report import seed_spread

    fold = {"seeds": 2, "seed_test_sharpe": [1.0, 3.0], "seed_test_sharpe_std": 2**0.5}
    results = {"trials": [{"trial_id": "a", "folds": [fold, {**fold, "seed_test_sharpe": [5.0, 7.0]}]}]}
    assert seed_spread(results, "a") == {"seeds": 2, "mean": 4.0, "std": 2**0.5, "folds": 2}
    assert seed_spread({"trials": [{"trial_id": "a", "folds": [{"seeds": 1}]}]}, "a") is None


def test_a_checkpointed_ensemble_writes_its_members_and_the_vote_reads_them_as_its_policy(market_data, tmp_path):  # noqa: F811
    """With a checkpoint directory, each member's kept weights (fold<k>.m<i>), the fold's result
    unchanged; the sweep's vote of that one trial is the ensemble's own policy (its mean Q)."""
    from fxray.eval import pooled
    from fxray.sweep.vote import combine_trials, missing_checkpoints
    from fxray.track.records import fold_checkpoints

    data, fold = market_data
    folder = tmp_path / "checkpoints" / "a"
    result = EnsembleTrainer(data, CFG).run_fold(fold, seed=4, checkpoint_dir=folder)
    plain = EnsembleTrainer(data, CFG).run_fold(fold, seed=4)
    assert result.test == plain.test and result.val_score == plain.val_score
    names = sorted(p.name for p in folder.glob("*.safetensors"))
    assert names == [f"fold{fold.k}.m{i}.safetensors" for i in range(3)] and result.checkpoint.endswith(names[0])
    for i in range(3):
        meta = json.loads((folder / f"fold{fold.k}.m{i}.json").read_text())
        assert meta["test"]["sharpe"] == result.seed_spread["test_sharpe"][i] and meta["config"]["seeds"] == 1
        assert meta["ensemble"] == {
            "seeds": 3, "val_score": result.val_score, "val": result.val, "test": result.test,
            "member": i, "member_seed": 4 + i * 7919,
        }  # fmt: skip
    # what the vote and the sweep's best_checkpoint artifact read: every member of the fold
    got = [p.name for p in fold_checkpoints(Path(result.checkpoint).parent, fold.k)]
    assert got == [f"fold{fold.k}.m{i}.safetensors" for i in range(3)]
    ppy = data.calendar.periods_per_year
    trial = {"trial_id": "a", "status": "ok", "folds_done": 1, "config": CFG.as_dict(), "val": {"sharpe": 1.0}}
    results = {"folds": [fold.as_dict()], "storage": str(tmp_path), "periods_per_year": ppy, "trials": [trial]}
    assert missing_checkpoints(results, [trial]) == []
    vote = combine_trials(results, data, sizes=[1], combine="vote")[1]["test"]
    want = pooled.pooled([result.test_periods], CFG.cost, ppy)
    assert vote["n_trades"] == want["n_trades"] > 0 and vote["sharpe"] == pytest.approx(want["sharpe"], rel=1e-6)


def test_rescore_of_a_seed_ensemble_says_why_in_one_line(tmp_path, capsys):
    """scripts/rescore.py reads one network a fold: a seed ensemble's best trial is refused in
    one line naming the file, before any data is opened."""
    import runpy

    res = tmp_path / "results.json"
    trial = {"trial_id": "0007", "config": {"seeds": 3}}
    res.write_text(json.dumps({"best": {"trial_id": "0007"}, "trials": [trial], "data": {"path": "nowhere"}}))
    rescore = runpy.run_path("scripts/rescore.py")
    assert rescore["main"]([str(res)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rescore: error: {res}: the best trial is a seed ensemble (seeds = 3)")
