"""fxray.export and fxray.backtest on a real tiny training on real bars (conftest.eurusd_trained):
the bundle's ONNX equals the torch Q-network, the frozen backtest of the last fold's test window
gives back the training's test metrics bit for bit (CPU), the model choices, old checkpoints,
and every bad input as one line and exit 2 through the real CLIs."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.policy import onnx
from fxray.policy.bundle import BundleError, load
from fxray.policy.export import ExportError, choose, export_bundle, load_candidate
from fxray.policy.frozen import q_network, q_values
from fxray.rl.checkpoint import load_checkpoint
from fxray.rl.device import DeviceData

ROOT = Path(__file__).resolve().parents[1]


def cli(module, args, cwd, timeout=300):
    cmd = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bundles(eurusd_trained, tmp_path_factory):
    """{"last": dir, "ensemble": dir} exported through the CLI from the checkpoint directory."""
    d, out = eurusd_trained, tmp_path_factory.mktemp("bundles")
    for model in ("last", "ensemble"):
        r = cli("fxray.export", [d["checkpoints"], "--data", d["cache"], "--out", out / model, "--model", model], out)
        assert r.returncode == 0, r.stderr
    return {m: out / m for m in ("last", "ensemble")}


# --- parity -------------------------------------------------------------------------------


def test_onnx_equals_the_torch_q_network(bundles, eurusd_trained):
    """Every member's ONNX graph (onnxruntime, CPU) == QNetwork.q_all (torch, CPU) on the
    member's test-window states and on wide random inputs: |diff| <= 1e-5 + 1e-5 |Q|."""
    bundle = load(bundles["ensemble"])
    assert len(bundle.members) == 2
    data = DeviceData(cache.open(eurusd_trained["cache"]), "cpu")
    rng = np.random.default_rng(0)
    for m in bundle.members:
        net = q_network(m.weights)
        data.mean.copy_(torch.from_numpy(m.mean))
        data.inv_std.copy_(torch.from_numpy(m.inv_std))
        a, b = m.fold["test"]
        for market in (
            data.states(torch.arange(a, b)),
            torch.from_numpy(rng.normal(0, 5, (5000, 50)).astype(np.float32)),
        ):
            with torch.no_grad():
                want = net.q_all(market.unsqueeze(0))[0].numpy()
            got = onnx.run(onnx.session(m.onnx), market.numpy())
            assert got.shape == want.shape == (len(market), 3, 3)
            assert np.all(np.abs(got - want) <= onnx.ONNX_ATOL + onnx.ONNX_RTOL * np.abs(want))
            assert np.ptp(want) > 0  # not a constant network: the comparison means something


def test_backtest_of_the_last_folds_test_window_reproduces_training(bundles, eurusd_trained, tmp_path):
    """The CLI on the data it was trained on, --window test: the fold's test metrics and hourly
    returns as fxray.train wrote them, bit for bit (torch on CPU); onnxruntime: the same
    positions here, so the same numbers to rounding."""
    fold = eurusd_trained["train"]["folds"][-1]
    out = {}
    for engine in ("torch", "onnxruntime"):
        args = ["--policy", bundles["last"], "--data", eurusd_trained["cache"], "--window", "test"]
        r = cli(
            "fxray.backtest",
            [*args, "--engine", engine, "--device", "cpu", "--json", tmp_path / f"{engine}.json"],
            tmp_path,
        )
        assert r.returncode == 0, r.stderr
        out[engine] = json.loads((tmp_path / f"{engine}.json").read_text())
    bt = out["torch"]
    assert bt["policy"]["metrics"] == fold["test"] and bt["policy"]["metrics"]["n_trades"] > 0
    assert bt["policy"]["periods"] == fold["test_periods"]
    assert bt["window"]["start"] == fold["fold"]["test"][0] and bt["data"]["same_as_training"]
    hold = fold["baseline_periods"]["buy_and_hold"]["test"]
    assert bt["baselines"]["buy_and_hold"]["pooled"]["total_return"] == pytest.approx(np.sum(hold["net"]), abs=1e-12)
    assert bt["baselines"]["flat"]["pooled"]["evidence"] == "none"
    assert bt["policy"]["pooled"]["psr"] is not None and bt["periods_per_year"] > 5000
    ort = out["onnxruntime"]["policy"]
    assert ort["metrics"]["n_trades"] == fold["test"]["n_trades"]
    assert ort["metrics"]["sharpe"] == pytest.approx(fold["test"]["sharpe"], rel=1e-9)


def test_ensemble_is_the_mean_of_its_members(bundles, eurusd_trained):
    ens, last = load(bundles["ensemble"]), load(bundles["last"])
    data = DeviceData(cache.open(eurusd_trained["cache"]), "cpu")
    window = (0, data.n_bars)
    q_ens = q_values(ens, data, window)
    singles = []
    for m in ens.members:
        one = dataclasses.replace(ens, members=[m])
        singles.append(q_values(one, data, window))
    torch.testing.assert_close(q_ens, (singles[0] + singles[1]) / 2, rtol=0, atol=1e-6)
    torch.testing.assert_close(q_values(last, data, window), singles[-1], rtol=0, atol=0)


# --- which model, which statistics -------------------------------------------------------


def test_model_choices(eurusd_trained):
    cands = [load_candidate(p) for p in sorted(eurusd_trained["checkpoints"].glob("fold*.safetensors"))]
    scores = {c.k: c.val_score for c in cands}
    assert set(scores) == {0, 1} and all(s is not None for s in scores.values())
    assert [c.k for c in choose(cands, "last")] == [1]
    assert [c.k for c in choose(cands, "ensemble")] == [0, 1]
    assert [c.k for c in choose(cands, "best")] == [max(scores, key=scores.get)]
    assert [c.k for c in choose(cands, "fold:0")] == [0]
    for bad, needle in (("fold:7", "no checkpoint of that fold"), ("median", "use one of last, best")):
        with pytest.raises(ExportError, match=needle):
            choose(cands, bad)
    for c in cands:
        c.val_score = None
    with pytest.raises(ExportError, match="has no val score"):
        choose(cands, "best")


def test_an_old_checkpoint_gets_its_statistics_from_the_data(eurusd_trained, tmp_path):
    """A checkpoint without stored normalisation (written before fxray stored it): the export
    recomputes it from the data's train slice, bit-equal to what the training stored (CPU)."""
    src = eurusd_trained["checkpoints"] / "fold1.safetensors"
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(src, old / src.name)
    meta = json.loads(src.with_suffix(".json").read_text())
    stored = meta.pop("normalisation")
    (old / "fold1.json").write_text(json.dumps(meta))
    market = cache.open(eurusd_trained["cache"])
    export_bundle([load_candidate(old / src.name)], market, tmp_path / "b", model="last", source={"kind": "test"})
    bundle = load(tmp_path / "b")
    m = bundle.members[0]
    assert "recomputed" in bundle.manifest["members"][0]["normalisation_from"]
    assert np.array_equal(m.mean, np.asarray(stored["mean"], np.float32))
    assert np.array_equal(m.inv_std, np.asarray(stored["inv_std"], np.float32))
    tensors, _ = load_checkpoint(src)
    assert all(np.array_equal(m.weights[k], v.numpy()) for k, v in tensors.items())


def test_export_refuses_data_the_checkpoint_was_not_trained_on(eurusd_trained, synth_cache, tmp_path):
    cand = load_candidate(eurusd_trained["checkpoints"] / "fold0.safetensors")
    with pytest.raises(ExportError, match="statistics differ from the checkpoint's: not the file it was trained on"):
        export_bundle([cand], cache.open(synth_cache), tmp_path / "b", model="last", source={})
    assert not (tmp_path / "b").exists() and not list(tmp_path.iterdir())  # nothing half-written


# --- bad input: one line, exit 2, nothing written ------------------------------------------


def reordered_cache(src: Path, out: Path, swap: bool = True) -> Path:
    """The same bars with two feature columns (and their names) swapped; without `swap`, the
    same columns less the last bar (another file: another content hash)."""
    m = cache.open(src)
    names, feats = list(m.feature_names), m.features.copy()
    if not swap:
        cache.write(
            out,
            m.ts[:-1],
            feats[:-1],
            m.ofi[:-1],
            m.targets[:-1],
            feature_names=names,
            ofi_names=m.ofi_names,
            instrument="EURUSD",
            bar="1min",
            source="test",
        )
        return out
    names[0], names[1] = names[1], names[0]
    feats[:, [0, 1]] = feats[:, [1, 0]]
    cache.write(
        out,
        m.ts,
        feats,
        m.ofi,
        m.targets,
        feature_names=names,
        ofi_names=m.ofi_names,
        instrument="EURUSD",
        bar="1min",
        source="test",
    )
    return out


def broken_bundle(src: Path, out: Path, how: str) -> Path:
    shutil.copytree(src, out)
    manifest = json.loads((out / "manifest.json").read_text())
    if how == "missing":
        (out / manifest["members"][0]["onnx"]).unlink()
    elif how == "version":
        manifest["version"] = 99
        (out / "manifest.json").write_text(json.dumps(manifest))
    elif how == "changed":
        with open(out / "normalisation.safetensors", "r+b") as f:
            f.seek(-4, 2)
            f.write(b"\x00\x00\x80\x7f")
    return out


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "fold1.onnx: missing from the bundle (manifest.json lists it)"),
        ("version", "bundle version 99 is unknown to this fxray (reads 1)"),
        ("changed", "normalisation.safetensors: sha256 differs from manifest.json's"),
        ("reordered", "feature names differ from the policy's at column 0 (data 'ret_2', policy 'ret_1')"),
        ("no_bundle", "no such bundle directory"),
        ("test_window_other_data", "is not the data the policy was trained on"),
        ("short", "a backtest needs at least 2"),
    ],
)
def test_backtest_bad_input_is_one_line(case, needle, bundles, eurusd_trained, tmp_path):
    policy, data = bundles["last"], eurusd_trained["cache"]
    extra = []
    if case in ("missing", "version", "changed"):
        policy = broken_bundle(bundles["last"], tmp_path / "p", case)
    elif case == "reordered":
        data = reordered_cache(data, tmp_path / "reordered.fxcache")
    elif case == "no_bundle":
        policy = tmp_path / "nothing"
    elif case == "test_window_other_data":
        data, extra = reordered_cache(data, tmp_path / "shorter.fxcache", swap=False), ["--window", "test"]
    elif case == "short":
        extra = ["--from", "2017-01-05T10:00", "--to", "2017-01-05T10:01"]
    r = cli("fxray.backtest", ["--policy", policy, "--data", data, "--json", tmp_path / "bt.json", *extra], tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not (tmp_path / "bt.json").exists()


@pytest.mark.slow
def test_export_bad_input_is_one_line(eurusd_trained, bundles, tmp_path):
    ck = eurusd_trained["checkpoints"]
    cases = [
        ([tmp_path / "nope.safetensors", "--out", tmp_path / "o"], "not an MLflow run id"),
        ([ck, "--out", tmp_path / "o"], "pass --data with the fxcache it was trained on"),
        ([ck, "--data", eurusd_trained["cache"], "--out", bundles["last"]], "exists; pass --force"),
        (
            [ck, "--data", eurusd_trained["cache"], "--out", tmp_path / "o", "--model", "fold:9"],
            "no checkpoint of that fold",
        ),
        ([ck, "--data", tmp_path / "none.fxcache", "--out", tmp_path / "o"], "no such file"),
        (
            ["0" * 32, "--out", tmp_path / "o", "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}"],
            "no such sqlite file",
        ),
    ]
    for args, needle in cases:
        r = cli("fxray.export", args, tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
        assert not (tmp_path / "o").exists()
    with pytest.raises(BundleError, match="missing"):
        load(broken_bundle(bundles["last"], tmp_path / "p", "missing"))
