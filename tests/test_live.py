"""fxray.live: the streaming policy on real bars gives the on-device backtest's positions on
the same window; the warm-up is enforced with a state that is not a position; the CLI streams
stdin end to end; bad bars are one line and exit 2."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.data.features import MAX_LOOKBACK
from fxray.data.stream import StreamError
from fxray.eval.backtest import greedy_positions
from fxray.live import WARMING_UP, Policy
from fxray.policy.bundle import BundleError, load
from fxray.policy.export import choose, export_bundle, load_candidate
from fxray.policy.frozen import q_values
from fxray.policy.live import bfloat16_round
from fxray.rl.device import DeviceData

NEAR_TIE = 1e-4  # Q margin below which numpy's and torch's float32 GEMMs may pick differently


@pytest.fixture(scope="module")
def bundle_dirs(eurusd_trained, tmp_path_factory):
    d = tmp_path_factory.mktemp("live_bundles")
    cands = [load_candidate(p) for p in sorted(eurusd_trained["checkpoints"].glob("fold*.safetensors"))]
    market = cache.open(eurusd_trained["cache"])
    for model in ("last", "ensemble"):
        export_bundle(choose(cands, model), market, d / model, model=model, source={"kind": "test"})
    return {m: d / m for m in ("last", "ensemble")}


def stream_positions(policy: Policy, bars, n: int | None = None) -> list:
    n = len(bars) if n is None else n
    v = np.zeros(len(bars)) if bars.volume is None else bars.volume
    return [policy.on_bar(bars.ts[i], bars.open[i], bars.high[i], bars.low[i], bars.close[i], v[i]) for i in range(n)]


@pytest.mark.parametrize("model, engine", [("last", "numpy"), ("ensemble", "numpy"), ("last", "onnxruntime")])
def test_streaming_positions_equal_the_backtests(model, engine, bundle_dirs, eurusd_trained):
    """Raw bars from the first one (the cache dropped the first MAX_LOOKBACK as warm-up):
    after the warm-up, bar MAX_LOOKBACK + i is cache row i, and the streamed position is the
    backtest's (greedy from flat over the whole cache, torch on CPU) at every bar -- except
    where the two float32 Q computations tie within NEAR_TIE (none here)."""
    bundle = load(bundle_dirs[model])
    bars = eurusd_trained["bars"]
    got = stream_positions(Policy(bundle, engine=engine), bars)
    assert all(p is WARMING_UP for p in got[:MAX_LOOKBACK])
    got = np.array(got[MAX_LOOKBACK:], dtype=np.int64)
    data = DeviceData(cache.open(eurusd_trained["cache"]), "cpu")
    q = q_values(bundle, data, (0, data.n_bars))  # (N - 1, 3, 3): rows with a next bar
    want = greedy_positions(q).numpy().astype(np.int64)
    assert len(got) == data.n_bars and len(want) == data.n_bars - 1
    differ = np.flatnonzero(got[:-1] != want)
    assert np.count_nonzero(np.diff(want)) > 100  # a policy that trades: the match is not trivial
    if len(differ):  # allowed only at a near tie of the first differing bar's Q
        t = differ[0]
        prev = want[t - 1] if t else 0
        top2 = np.sort(q[t, prev + 1].numpy())[-2:]
        assert top2[1] - top2[0] < NEAR_TIE, f"bar {t}: positions differ without a near tie"
    assert len(differ) == 0


def test_warm_up_is_enforced_with_a_state_that_is_not_a_position(bundle_dirs, eurusd_trained):
    policy = Policy(bundle_dirs["last"])
    bars = eurusd_trained["bars"]
    assert policy.warming_up and policy.bars_to_go == MAX_LOOKBACK + 1
    out = stream_positions(policy, bars, MAX_LOOKBACK)
    assert all(p is WARMING_UP for p in out) and policy.bars_to_go == 1 and policy.warming_up
    with pytest.raises(TypeError, match="not a position"):
        bool(WARMING_UP)
    with pytest.raises(TypeError):
        int(WARMING_UP)
    assert WARMING_UP != 0 and repr(WARMING_UP) == "WARMING_UP"
    i = MAX_LOOKBACK
    first = policy.on_bar(bars.ts[i], bars.open[i], bars.high[i], bars.low[i], bars.close[i])
    assert first in (-1, 0, 1) and not policy.warming_up and policy.position == first


def test_bad_bars_are_refused_and_leave_the_policy_as_it_was(bundle_dirs, eurusd_trained):
    policy, bars = Policy(bundle_dirs["last"]), eurusd_trained["bars"]
    stream_positions(policy, bars, 200)
    ts, o, h, l, c = bars.ts[200], bars.open[200], bars.high[200], bars.low[200], bars.close[200]
    for args, kwargs, needle in [
        ((bars.ts[150], o, h, l, c), {}, "is not after the previous bar's"),
        ((ts, o, h, l, float("nan")), {}, "close = nan"),
        ((ts, o, h, l, c), {"ofi": [0.0] * 7}, "ofi must be 8 finite values"),
        ((ts, o, h, l, c), {"ofi": {"vpin": 1.0, "ofi": 2.0}}, r"ofi keys \['ofi', 'vpin'\]: ofi not among ofi_l1"),
        ((float(ts), o, h, l, c), {}, "give int ns since epoch"),
    ]:
        with pytest.raises(StreamError, match=needle):
            policy.on_bar(*args, **kwargs)
    positions = [policy.position]
    for i in range(200, 400):
        positions.append(policy.on_bar(bars.ts[i], bars.open[i], bars.high[i], bars.low[i], bars.close[i]))
    again = Policy(bundle_dirs["last"])
    assert stream_positions(again, bars, 400)[199:] == positions


def test_a_policy_trained_on_bars_is_not_moved_by_order_flow(bundle_dirs, eurusd_trained):
    """It reads none (its ofi columns were zeros in training: bundle.ofi_read is empty): the
    order flow it is given, in order or by name, is not read (fed 0, as in training): the
    positions and Q-values it has without any."""
    bars, n = eurusd_trained["bars"], 400
    flow = np.random.default_rng(0).normal(0, 3, (n, 8))
    plain, given, named = (Policy(bundle_dirs["last"]) for _ in range(3))
    assert plain.bundle.ofi_read == []
    for i in range(n):
        bar = bars.ts[i], bars.open[i], bars.high[i], bars.low[i], bars.close[i]
        want = plain.on_bar(*bar)
        assert given.on_bar(*bar, None, flow[i]) == want == named.on_bar(*bar, ofi=dict(zip(named.ofi_names, flow[i])))
        assert np.array_equal(given.q, plain.q, equal_nan=True) and np.array_equal(named.q, plain.q, equal_nan=True)
    assert not plain.warming_up and not np.isnan(plain.q).any()


def test_timestamps_as_datetimes_and_numpy():
    import datetime as dt

    from fxray.policy.live import to_ns

    t = 1_483_347_780 * 10**9
    assert (
        to_ns(dt.datetime(2017, 1, 2, 9, 3, tzinfo=dt.UTC)) == t == to_ns(np.datetime64(t, "ns")) == to_ns(np.int64(t))
    )
    with pytest.raises(StreamError, match="no time zone"):
        to_ns(dt.datetime(2017, 1, 2))


def test_bfloat16_rounding_is_torchs():
    x = np.random.default_rng(0).normal(0, 3, 100_000).astype(np.float32)
    x[:4] = [1.00390625, 1.01171875, -2.5, 0.0]  # exact ties: to even
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(bfloat16_round(x), want)


def test_a_bundle_of_other_features_is_refused(bundle_dirs, tmp_path):
    import json
    import shutil

    shutil.copytree(bundle_dirs["last"], tmp_path / "b")
    manifest = json.loads((tmp_path / "b/manifest.json").read_text())
    names = manifest["inputs"]["feature_names"]
    names[3], names[4] = names[4], names[3]
    (tmp_path / "b/manifest.json").write_text(json.dumps(manifest))
    bundle = load(tmp_path / "b")  # the manifest is not hashed: its own content is checked
    with pytest.raises(BundleError, match="streaming features: feature names differ from the policy's at column 3"):
        Policy(bundle)


# --- the CLI ---------------------------------------------------------------------------


def csv_text(bars, n: int) -> str:
    cols = [bars.ts.tolist(), bars.open.tolist(), bars.high.tolist(), bars.low.tolist(), bars.close.tolist()]
    rows = [",".join(repr(col[i]) for col in cols) for i in range(n)]  # repr: floats round-trip exactly
    return "ts,open,high,low,close\n" + "\n".join(rows) + "\n"


def test_cli_streams_stdin_and_matches_the_library(bundle_dirs, eurusd_trained, tmp_path):
    bars, n = eurusd_trained["bars"], 1500
    cmd = [sys.executable, "-m", "fxray.live", "--policy", str(bundle_dirs["last"]), "--bars", "-"]
    r = subprocess.run(cmd, input=csv_text(bars, n), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "ts,position" and len(lines) == n + 1
    got = [line.split(",")[1] for line in lines[1:]]
    want = [("warmup" if p is WARMING_UP else str(p)) for p in stream_positions(Policy(bundle_dirs["last"]), bars, n)]
    assert got == want and got.count("warmup") == MAX_LOOKBACK
    assert "1500 bars (120 warm-up)" in r.stderr and "on_bar median" in r.stderr


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda rows: rows[:10] + [rows[12]] + rows[11:], "line 12: bar 10: ts"),
        (
            lambda rows: rows[:5] + [rows[5].rsplit(",", 1)[0] + ",nan"] + rows[6:],
            "line 6: bar 4 (ts 1483340700000000000): close = nan",
        ),
        (lambda rows: ["ts,open,high,close"] + rows[1:], "lacks low"),
        (lambda rows: rows[:3] + ["2017-01-02T09:06:00Z,1.0,1.0"] + rows[4:], "line 4: 3 fields"),
    ],
    ids=["out_of_order", "nan", "no_low_column", "short_line"],
)
def test_cli_bad_bars_are_one_line_and_write_nothing(mutate, needle, bundle_dirs, eurusd_trained, tmp_path):
    rows = csv_text(eurusd_trained["bars"], 200).splitlines()
    (tmp_path / "bars.csv").write_text("\n".join(mutate(rows)) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "fxray.live",
        "--policy",
        str(bundle_dirs["last"]),
        "--bars",
        str(tmp_path / "bars.csv"),
    ]
    r = subprocess.run([*cmd, "--out", str(tmp_path / "pos.csv")], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bars.csv"]  # no positions file, no temp file


@pytest.mark.slow
def test_cli_on_the_shared_histdata_file_gives_the_backtests_positions(bundle_dirs, eurusd_trained, tmp_path):
    """End to end through both commands: `fxray.live --format histdata` on the raw file the
    cache was built from, and `fxray.backtest --positions` on the cache: the same ts and
    positions for every bar after the warm-up."""
    from conftest import EURUSD_JAN, SHARED_DATA

    policy = str(bundle_dirs["last"])
    live = [sys.executable, "-m", "fxray.live", "--policy", policy, "--bars", str(SHARED_DATA / EURUSD_JAN)]
    r = subprocess.run(
        [*live, "--format", "histdata", "--out", str(tmp_path / "live.csv")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    bt = [sys.executable, "-m", "fxray.backtest", "--policy", policy, "--data", str(eurusd_trained["cache"])]
    r = subprocess.run(
        [*bt, "--device", "cpu", "--positions", str(tmp_path / "bt.csv")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    streamed = [line.split(",") for line in (tmp_path / "live.csv").read_text().splitlines()[1:]]
    assert [p for _, p in streamed[:MAX_LOOKBACK]] == ["warmup"] * MAX_LOOKBACK
    backtested = [line.split(",") for line in (tmp_path / "bt.csv").read_text().splitlines()[1:]]
    assert len(backtested) == len(streamed) - MAX_LOOKBACK - 1 > 30_000  # the backtest stops a bar early
    assert streamed[MAX_LOOKBACK:-1] == backtested


def test_cli_refuses_a_broken_bundle(bundle_dirs, eurusd_trained, tmp_path):
    import shutil

    shutil.copytree(bundle_dirs["last"], tmp_path / "b")
    (tmp_path / "b/normalisation.safetensors").unlink()
    cmd = [sys.executable, "-m", "fxray.live", "--policy", str(tmp_path / "b"), "--bars", "-"]
    r = subprocess.run(cmd, input=csv_text(eurusd_trained["bars"], 10), capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "normalisation.safetensors: missing from the bundle" in lines[0]
    assert r.stdout == ""
