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

from fxray import backtest, export, live
from fxray.data import cache
from fxray.data.schema import OFI_NAMES
from fxray.live import WARMING_UP, Policy
from fxray.policy import onnx
from fxray.policy.bundle import BundleError, load, reads_ofi
from fxray.policy.export import ExportError, choose, export_bundle, load_candidate
from fxray.policy.frozen import q_network, q_values
from fxray.rl.device import DeviceData

ROOT = Path(__file__).resolve().parents[1]


def cli(module, args, cwd, timeout=300):
    cmd = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def synth_bundle(synth_cache, tmp_path_factory):
    """A policy trained on the synthetic market (whose order-flow columns carry its signal): one
    fold of experiments/smoke.yaml, one epoch (~1 s), exported as `last`."""
    from fxray import train

    d = tmp_path_factory.mktemp("synth_policy")
    argv = ["--data", synth_cache, "--experiment", ROOT / "experiments/smoke.yaml", "--device", "cpu"]
    argv += ["--folds", "0", "--epochs", "1", "--checkpoint-dir", d / "ckpt"]
    assert train.main([str(a) for a in argv]) == 0
    cand = load_candidate(d / "ckpt/seed0/fold0.safetensors")
    export_bundle([cand], cache.open(synth_cache), d / "policy", model="last", source={"kind": "test"})
    return d / "policy"


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
    assert set(scores) == {0, 1}
    assert [c.k for c in choose(cands, "last")] == [1]
    assert [c.k for c in choose(cands, "ensemble")] == [0, 1]
    assert [c.k for c in choose(cands, "best")] == [max(scores, key=scores.get)]
    assert [c.k for c in choose(cands, "fold:0")] == [0]
    for bad, needle in (("fold:7", "no checkpoint of that fold"), ("median", "use one of last, best")):
        with pytest.raises(ExportError, match=needle):
            choose(cands, bad)


def test_export_refuses_data_the_checkpoint_was_not_trained_on(eurusd_trained, synth_cache, tmp_path):
    cand = load_candidate(eurusd_trained["checkpoints"] / "fold0.safetensors")
    with pytest.raises(ExportError, match="statistics differ from the checkpoint's: not the file it was trained on"):
        export_bundle([cand], cache.open(synth_cache), tmp_path / "b", model="last", source={})
    assert not (tmp_path / "b").exists() and not list(tmp_path.iterdir())  # nothing half-written


# --- on another market: the inputs the policy reads -----------------------------------------

SYNTH_FLOW = ["flow_imbalance", "depth_imbalance", "trade_imbalance", "flow_intensity"]  # the views of its signal


def bars_csv(path: Path, bars, n: int, ofi: dict | None = None) -> Path:
    """The first n bars as the live CLI's CSV (ts as int ns; floats round-trip), with `ofi` columns."""
    cols = {"ts": bars.ts, "open": bars.open, "high": bars.high, "low": bars.low, "close": bars.close}
    cols.update(ofi or {})
    rows = (",".join(str(int(c[i])) if k == "ts" else repr(float(c[i])) for k, c in cols.items()) for i in range(n))
    path.write_text(",".join(cols) + "\n" + "\n".join(rows) + "\n")
    return path


def test_which_order_flow_a_policy_reads():
    """reads_ofi: an ofi column is read where some member weighs it and saw it other than 0 in
    training; one of zeros in training (bars alone: mean 0, inv_std 1) or of zero weight (a
    ridge front end's screen dropped it) is fed 0 and needed nowhere."""
    w = np.ones((4, 5), np.float32)
    w[:, 3] = 0  # 2 features, then ofi a, b, c: b has no weight
    mean, inv_std = np.array([1, 2, 0.5, 0.3, 0], np.float32), np.array([1, 1, 2, 4, 1], np.float32)
    assert reads_ofi([(w, mean, inv_std)], 2, ["a", "b", "c"]) == ["a"]  # c: zeros in training
    varied = inv_std.copy()
    varied[4] = 3.0  # another member saw c vary
    assert reads_ofi([(w, mean, inv_std), (w, mean, varied)], 2, ["a", "b", "c"]) == ["a", "c"]


def test_a_policy_trained_on_bars_runs_on_a_market_with_other_order_flow(bundles, synth_cache, tmp_path, capsys):
    """The policy of the real EURUSD bars reads no order flow (its ofi columns were zeros in
    training). On the synthetic market, whose ofi columns have other names and carry its signal,
    it runs, fed 0 there as in training: the positions and numbers it has on the same bars
    without order flow (zeros under fxray's own ofi names, as a cache built from bars)."""
    assert load(bundles["last"]).ofi_read == []
    m = cache.open(synth_cache)
    bare = tmp_path / "bare.fxcache"
    cache.write(bare, m.ts, m.features, None, m.targets, feature_names=list(m.feature_names),
                ofi_names=list(OFI_NAMES), instrument="SYNTH", bar="1min", source="test")  # fmt: skip
    out = {}
    for name, data in (("synth", synth_cache), ("bare", bare)):
        args = ["--policy", bundles["last"], "--data", data, "--device", "cpu", "--json", tmp_path / f"{name}.json"]
        assert backtest.main([str(a) for a in [*args, "--positions", tmp_path / f"{name}.csv"]]) == 0
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert f"does not read the data's order flow {', '.join(SYNTH_FLOW)}" in capsys.readouterr().out
    assert out["synth"]["policy"] == out["bare"]["policy"] and out["synth"]["policy"]["metrics"]["n_trades"] > 0
    assert (tmp_path / "synth.csv").read_text() == (tmp_path / "bare.csv").read_text()


def test_a_policy_that_reads_order_flow_is_refused_where_it_is_missing(
    synth_bundle, synth_cache, eurusd_trained, tmp_path, capsys
):
    """The synthetic market's policy reads its 4 order-flow views (not the 4 unused columns,
    zeros in training). On real bars, which have none: one line naming them and what to do,
    exit 2, nothing written, from the backtest and from the live CLI fed an OHLCV CSV (its
    header tells). Where they are, it runs: a CSV that carries them (the unused ones need not
    be there: what it is given in them is not read), and a synthetic market (the message's fix)."""
    from fxray.data.synth import GENERATOR_VERSION

    bundle = load(synth_bundle)
    assert bundle.ofi_read == SYNTH_FLOW and bundle.manifest["inputs"]["ofi_read"] == SYNTH_FLOW
    jan, bars = eurusd_trained["cache"], eurusd_trained["bars"]
    trained = f"it was trained on SYNTH from fxray.synth v{GENERATOR_VERSION}"
    argv = ["--policy", str(synth_bundle), "--data", str(jan), "--json", str(tmp_path / "bt.json")]
    assert backtest.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {jan}: lacks the order flow this policy reads: {', '.join(SYNTH_FLOW)} ({trained}; its ofi columns "
        "are all zeros: bars only); only fxray's synthetic markets have these columns: backtest it on one (fxray "
        f"data synth), or train a policy on this data (fxray tune --experiment EXPERIMENT.yaml --data {jan})"
    ]
    ohlc = bars_csv(tmp_path / "ohlc.csv", bars, 300)
    for out in (["--out", str(tmp_path / "pos.csv")], []):  # positions to a file, or to stdout
        assert live.main(["--policy", str(synth_bundle), "--bars", str(ohlc), *out]) == 2
        printed = capsys.readouterr()
        assert printed.out == "" and printed.err.strip().splitlines() == [
            f"error: {ohlc}: lacks the order flow this policy reads: {', '.join(SYNTH_FLOW)} ({trained}; its header: "
            "ts,open,high,low,close); only fxray's synthetic markets have these columns, no feed of real bars does: "
            "run a policy trained on bars (fxray tune --experiment EXPERIMENT.yaml --data BARS.fxcache)"
        ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ohlc.csv"]
    rng = np.random.default_rng(0)
    flow = rng.normal(0, 1, (300, 8))
    given = bars_csv(tmp_path / "flow.csv", bars, 300, dict(zip(SYNTH_FLOW, flow.T)))
    assert live.main(["--policy", str(synth_bundle), "--bars", str(given), "--out", str(tmp_path / "pos.csv")]) == 0
    streamed = [line.split(",")[1] for line in (tmp_path / "pos.csv").read_text().splitlines()[1:]]
    policy = Policy(bundle)  # all 8 columns given, the unused ones random: the same positions
    want = [policy.on_bar(bars.ts[i], bars.open[i], bars.high[i], bars.low[i], bars.close[i], None, flow[i])
            for i in range(300)]  # fmt: skip
    assert streamed == [("warmup" if p is WARMING_UP else str(p)) for p in want] and len(set(streamed)) > 2
    capsys.readouterr()
    assert backtest.main(["--policy", str(synth_bundle), "--data", str(synth_cache), "--device", "cpu"]) == 0


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


def test_without_the_export_extra_it_is_one_line_naming_it(eurusd_trained, bundles, tmp_path, monkeypatch, capsys):
    """As after the quick start's `pip install -c constraints.txt -e .` (no extras): onnx and
    onnxruntime are not importable. `fxray export` (it writes ONNX and checks it with onnxruntime):
    one line naming the extra and its command, exit 2, nothing written; `backtest --engine
    onnxruntime` the same; the default engine (torch) needs neither."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # what `import onnx` does where it is not installed
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    out = tmp_path / "out"
    argv = [eurusd_trained["checkpoints"], "--data", eurusd_trained["cache"], "--out", out / "policy"]
    assert export.main([str(a) for a in [*argv, "--json", out / "export.json"]]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: fxray export needs the `export` extra (onnx, onnxruntime not installed): "
        "pip install -c constraints.txt -e '.[export]'"
    ]
    assert not out.exists()
    bt = ["--policy", str(bundles["last"]), "--data", str(eurusd_trained["cache"]), "--device", "cpu"]
    assert backtest.main([*bt, "--engine", "onnxruntime"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --engine onnxruntime needs the `export` extra (onnxruntime not installed): "
        "pip install -c constraints.txt -e '.[export]'"
    ]
    assert backtest.main(bt) == 0


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
