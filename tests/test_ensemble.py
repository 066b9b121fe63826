"""Seed ensembles end to end: the train CLI's ensemble fold, its members' checkpoints, their export
as one policy, the vote that reads them, and the summary's seed spread. The ensemble's maths
(the mean-Q policy of its seeds, each trained alone) is checked in tests/test_learner.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_learner import BASE, market_data  # noqa: F401 (a fixture)

from fxray.rl.trainer import Trainer

CFG = BASE.replace(epochs=3, seeds=3)


def test_train_cli_with_seeds_reports_the_ensemble_and_its_seeds(tmp_path, synth_cache, short_folds_experiment):
    j = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "fxray.train", "--experiment", str(short_folds_experiment), "--data", str(synth_cache)]
    cmd += ["--device", "cpu", "--epochs", "2"]
    cmd += ["--folds", "1", "--set", "steps_per_epoch=20", "--set", "hidden=16", "--set", "seeds=2"]
    cmd += ["--set", "keep=best"]  # weights to export: 20 steps lose on val, and the profile keeps only a win
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
    out = json.loads(bt.read_text())
    assert out["policy"]["metrics"] == fold["test"] and fold["test"]["n_trades"] > 0  # bit for bit (CPU)
    assert out["as_trained"]["equal"] and out["as_trained"]["trained"] == fold["test"]  # the ensemble's, not a member's


def test_the_summary_reports_the_seeds_of_the_best_trials_ensemble():
    from fxray.track.report import seed_spread

    fold = {"seeds": 2, "seed_test_sharpe": [1.0, 3.0], "seed_test_sharpe_std": 2**0.5}
    assert seed_spread([fold, {**fold, "seed_test_sharpe": [5.0, 7.0]}]) == {
        "seeds": 2,
        "mean": 4.0,
        "std": 2**0.5,
        "folds": 2,
    }
    assert seed_spread([{"seeds": 1}]) is None


def test_a_checkpointed_ensemble_writes_its_members_and_the_vote_reads_them_as_its_policy(market_data, tmp_path):  # noqa: F811
    """With a checkpoint directory, each member's kept weights (fold<k>.m<i>), the fold's result
    unchanged; the sweep's vote of that one trial is the ensemble's own policy (its mean Q)."""
    from fxray.eval import pooled
    from fxray.sweep.vote import combine_trials, missing_checkpoints
    from fxray.track.records import fold_checkpoints

    data, fold = market_data
    folder = tmp_path / "checkpoints" / "a"
    (result,) = Trainer(data, [CFG]).run_fold(fold, [4], checkpoint_dirs=[folder])
    (plain,) = Trainer(data, [CFG]).run_fold(fold, [4])
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
    vote = combine_trials(results, data, sizes=[1])[1]["test"]
    want = pooled.pooled([result.test_periods], CFG.cost, ppy)
    assert vote["n_trades"] == want["n_trades"] > 0 and vote["sharpe"] == pytest.approx(want["sharpe"], rel=1e-6)
