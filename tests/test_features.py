"""fxray.features: indicators against the StockCharts worksheets, hand-computed features,
no look-ahead, warm-up, scale invariance, the CUSUM fast path against the plain loop."""

from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA

from fxray.data import features as F
from fxray.data.features import ADX_INDEX, FEATURE_NAMES, LOOKBACKS, MAX_LOOKBACK, compute_features

REFS = SHARED_DATA / "refs"
SIXE = SHARED_DATA / "bars/6EH4.XCME_1min_bars_20240101_20240131.csv.gz"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "features.md"
MIN_NS = 60 * 10**9
COL = {name: j for j, name in enumerate(FEATURE_NAMES)}


def worksheet(name):
    """A cs-*.csv worksheet as {column: float array} (blank cells -> NaN)."""
    path = REFS / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    rows = [line.rstrip("\n").split(",") for line in path.open()]
    head, body = rows[0], rows[1:]
    out = {}
    for j, col in enumerate(head):
        try:
            out[col] = np.array([float(r[j]) if r[j] != "" else np.nan for r in body])
        except ValueError:
            continue  # a date column
    return out


def random_bars(n, seed=0, price=100.0, vol=1e-3, with_volume=True):
    """A 1-minute random walk with OHLC consistent with its path and a weekend-free clock."""
    rng = np.random.default_rng(seed)
    ts = 1_704_067_260 * 10**9 + MIN_NS * np.arange(n, dtype=np.int64)  # 2024-01-01 00:01 UTC
    close = price * np.exp(np.cumsum(rng.normal(0, vol, n)))
    open_ = np.concatenate([[price], close[:-1]]) * np.exp(rng.normal(0, vol / 10, n))
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0, vol / 2, n)))
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0, vol / 2, n)))
    volume = rng.integers(1, 500, n).astype(np.float64) if with_volume else None
    return ts, open_, high, low, close, volume


# --- the table -------------------------------------------------------------------------


def test_names_lookbacks_and_docs():
    assert len(FEATURE_NAMES) == 42 == len(set(FEATURE_NAMES))
    assert ADX_INDEX == 40 and FEATURE_NAMES[40] == "adx_14"
    assert MAX_LOOKBACK == max(LOOKBACKS) <= 120
    assert all(len(row) == 4 and row[1] and row[3] for row in F.FEATURE_TABLE)
    assert DOCS.read_text().count(feature_table_markdown()) == 1, (
        "docs/features.md is stale: regenerate its table from feature_table_markdown() here"
    )


def feature_table_markdown() -> str:
    """FEATURE_TABLE as the markdown written to docs/features.md."""
    lines = ["| # | name | formula | lookback (bars) | source |", "|---|---|---|---|---|"]
    lines += [
        f"| {j} | `{name}` | {formula.replace('|', '&#124;')} | {lb} | {src} |"
        for j, (name, formula, lb, src) in enumerate(F.FEATURE_TABLE)
    ]
    return "\n".join(lines) + "\n"


# --- indicators against the StockCharts worksheets (to their rounding) ----------------------


def test_adx_and_di_match_worksheet():
    ws = worksheet("cs-adx.csv")
    h, l, c = ws["High"], ws["Low"], ws["Close"]
    plus_di, minus_di, adx = F.adx(h, l, c, 14)
    assert np.nanmax(np.abs(F.true_range(h, l, c)[1:] - ws["TR"][1:])) < 1e-6
    for mine, col in ((plus_di, "+DI14"), (minus_di, "-DI14"), (adx, "ADX")):
        ref = ws[col]
        defined = ~np.isnan(ref)
        assert np.array_equal(np.isnan(mine), ~defined), col  # same first defined row
        np.testing.assert_allclose(mine[defined], ref[defined], rtol=0, atol=6e-7, err_msg=col)
    assert np.flatnonzero(~np.isnan(adx))[0] == 27  # ADX seeded by the mean of DX 14..27


def test_wilder_sums_match_worksheet_tr14_dm14():
    ws = worksheet("cs-adx.csv")
    tr = F.true_range(ws["High"], ws["Low"], ws["Close"])
    tr14 = F.wilder(tr, 14, 14, tr[1:15].sum(), total=True)
    np.testing.assert_allclose(tr14[14:], ws["TR14"][14:], atol=6e-7)


@pytest.mark.parametrize("name,n", [("cs-atr.csv", 14), ("cs-atr2.csv", 10)])
def test_atr_matches_worksheet(name, n):
    ws = worksheet(name)
    mine = F.atr(ws["High"], ws["Low"], ws["Close"], n)
    defined = ws["ATR"] != 0  # the worksheet writes 0 before its first ATR
    assert np.flatnonzero(defined)[0] == n - 1 and np.isnan(mine[~defined]).all()
    np.testing.assert_allclose(mine[defined], ws["ATR"][defined], atol=1e-9)


def test_rsi_matches_worksheet_smoothing_and_a_plain_loop():
    ws = worksheet("cs-rsi.csv")
    c = ws["Close"]
    # the worksheet's averages of the gains/losses start at 0 at t=0; Wilder smoothing seeded so
    # gives them (the features seed it at t=14 by the mean of the first 14 changes instead)
    gain, loss = np.nan_to_num(ws["Gain"]), np.nan_to_num(ws["Loss"])
    np.testing.assert_allclose(F.wilder(gain, 14, 0, 0.0), ws["Avg Gain"], atol=6e-7)
    np.testing.assert_allclose(F.wilder(loss, 14, 0, 0.0), ws["Avg Loss"], atol=6e-7)
    # Wilder's own seeding (1978), by a plain loop over the worksheet's gains and losses
    want, avg_gain, avg_loss = [], gain[1:15].mean(), loss[1:15].mean()
    for t in range(14, len(c)):
        if t > 14:
            avg_gain, avg_loss = (13 * avg_gain + gain[t]) / 14, (13 * avg_loss + loss[t]) / 14
        want.append(100 - 100 / (1 + avg_gain / avg_loss))
    mine = F.rsi(c, 14)
    assert np.isnan(mine[:14]).all()
    np.testing.assert_allclose(mine[14:], want, atol=1e-9)


def test_macd_matches_worksheet():
    ws = worksheet("cs-macd.csv")
    line, signal, hist = F.macd(ws["Close"])
    np.testing.assert_allclose(line[1:], ws["MACD_line"][1:], atol=1e-9)
    np.testing.assert_allclose(F.ema(ws["Close"], 12), ws["short_ema"], atol=1e-8)
    np.testing.assert_allclose(F.ema(ws["Close"], 26), ws["long_ema"], atol=1e-8)
    # The worksheet seeds its signal EMA at row 2 with its own value; seeded alike, ours agrees.
    seeded = F.ema(line[2:], 9, init=ws["MACD_signal"][2])
    np.testing.assert_allclose(seeded, ws["MACD_signal"][2:], atol=1e-9)
    np.testing.assert_allclose(line[2:] - seeded, ws["MACD_diff"][2:], atol=1e-9)
    # Our default seed (line_0 = 0) differs only by a decaying 0.8^t transient.
    np.testing.assert_allclose(signal[90:], ws["MACD_signal"][90:], atol=1e-9)
    np.testing.assert_allclose(hist[90:], ws["MACD_diff"][90:], atol=1e-9)
    assert abs(signal[2] - ws["MACD_signal"][2]) > 0.1  # ...and that transient is real


def test_bollinger_matches_worksheet():
    ws = worksheet("cs-bbands.csv")
    c = ws["Close"]
    mid, upper, lower = F.bollinger(c, 20, 2.0)
    for mine, col in (
        (mid, "MiddleBand"),
        (upper, "HighBand"),
        (lower, "LowBand"),
        (F.bollinger_pctb(c, 20, 2.0), "PercentageBand"),
    ):
        ref = ws[col]
        defined = ~np.isnan(ref)
        assert np.isnan(mine[~defined]).all(), col
        np.testing.assert_allclose(mine[defined], ref[defined], atol=6e-7, err_msg=col)


def test_ema_and_wilder_equal_the_plain_recursion():
    x = np.random.default_rng(3).normal(size=200)
    y, avg = [x[0]], [np.nan] * 5 + [1.5]
    for v in x[1:]:
        y.append(0.2 * v + 0.8 * y[-1])
    for v in x[6:]:
        avg.append((13 * avg[-1] + v) / 14)
    np.testing.assert_allclose(F.ema(x, 9), y, rtol=1e-12)
    np.testing.assert_allclose(F.wilder(x, 14, 5, 1.5), avg, rtol=1e-12)
    assert F.ema(np.array([]), 9).shape == (0,)


# --- CUSUM ---------------------------------------------------------------------------------


def cusum_plain(y, h):
    """AFML snippet 2.4, per bar, each side resetting on its own (the reference)."""
    s_pos = s_neg = 0.0
    out = np.zeros((3, len(y)))
    for t, (yt, ht) in enumerate(zip(y, h)):
        s_pos, s_neg, e = max(0.0, s_pos + yt), min(0.0, s_neg + yt), 0
        if s_pos > ht:
            s_pos, e = 0.0, e + 1
        if s_neg < -ht:
            s_neg, e = 0.0, e - 1
        out[:, t] = s_pos, s_neg, e
    return out


@pytest.mark.parametrize(
    "n,drift", [(1, 0.0), (7, 0.0), (255, 0.3), (257, 0.0), (5000, 0.05), (40_001, 0.0), (3000, 5.0)]
)
def test_cusum_chunked_is_bit_identical_to_the_loop(n, drift):
    rng = np.random.default_rng(n)
    y = rng.normal(0, 1, n) + drift
    h = np.abs(rng.normal(4, 1, n))
    h[: min(n, 10)] = np.inf
    s_pos, s_neg, event = F.cusum_filter(y, h)
    ref = cusum_plain(y, h)
    assert np.array_equal(s_pos, ref[0]) and np.array_equal(s_neg, ref[1])
    assert np.array_equal(event, ref[2]) and event.dtype == np.int8


def test_cusum_without_any_reset_still_exact():
    # Pure drift, no threshold: no chunk ever merges, every fix-up sweep is needed.
    y, h = np.full(3000, 1e-3), np.full(3000, np.inf)
    assert np.array_equal(F.cusum_filter(y, h)[0], cusum_plain(y, h)[0])


# --- the feature matrix --------------------------------------------------------------------


def test_shape_dtype_finite_and_warmup_zeros():
    bars = random_bars(2000)
    x = compute_features(*bars)
    assert x.shape == (2000, 42) and x.dtype == np.float32 and x.flags.c_contiguous
    assert np.isfinite(x).all()
    for j, lb in enumerate(LOOKBACKS):
        assert not x[:lb, j].any(), FEATURE_NAMES[j]
        assert x[lb:, j].any() or FEATURE_NAMES[j] == "cusum_event", FEATURE_NAMES[j]
    short = compute_features(*(a[:30] for a in bars))
    assert short.shape == (30, 42) and np.isfinite(short).all() and not short[:, COL["adx_14"]].any()
    assert compute_features(*(a[:0] for a in bars)).shape == (0, 42)


def test_hand_computed_features():
    ts, o, h, l, c, v = random_bars(500, seed=5)
    x = compute_features(ts, o, h, l, c, v).astype(np.float64)
    t = 321
    r = np.diff(np.log(c))
    w60 = slice(t - 59, t + 1)
    expect = {
        "ret_5": np.log(c[t] / c[t - 5]),
        "hl_range": np.log(h[t] / l[t]),
        "body": np.log(c[t] / o[t]),
        "close_loc": (c[t] - l[t]) / (h[t] - l[t]) - 0.5,
        "gap": np.log(o[t] / c[t - 1]),
        "rv_10": np.sqrt(np.mean(r[t - 10 : t] ** 2)),
        "pk_30": np.sqrt(np.mean(np.log(h[t - 29 : t + 1] / l[t - 29 : t + 1]) ** 2) / (4 * np.log(2))),
        "ma_dev_20": np.log(c[t] / c[t - 19 : t + 1].mean()),
        "donchian_60": (c[t] - l[w60].min()) / (h[w60].max() - l[w60].min()) - 0.5,
        "bb_width_20": 4 * c[t - 19 : t + 1].std() / c[t - 19 : t + 1].mean(),
        "vol_imb_20": (np.sign(c - o) * v)[t - 19 : t + 1].sum() / v[t - 19 : t + 1].sum(),
        "vol_rel_60": np.log((v[t] + v[t - 59 : t + 1].mean()) / (2 * v[t - 59 : t + 1].mean())),
        "atr_14": F.atr(h, l, c, 14)[t] / c[t],
        "adx_14": F.adx(h, l, c, 14)[2][t],
    }
    for name, value in expect.items():
        assert x[t, COL[name]] == pytest.approx(value, rel=1e-5, abs=1e-8), name


def test_calendar_features():
    # 2024-01-01 was a Monday: 00:00 UTC is phase 0 of both the day and the week; 06:00 is
    # a quarter day; Thursday 00:00 is 3/7 of the week.
    day0 = 1_704_067_200 * 10**9
    ts = np.array([day0, day0 + 6 * 3600 * 10**9, day0 + 3 * 86_400 * 10**9])
    x = compute_features(ts, *([np.ones(3)] * 4))
    np.testing.assert_allclose(x[:, COL["tod_sin"]], [0, 1, 0], atol=1e-6)
    np.testing.assert_allclose(x[:, COL["tod_cos"]], [1, 0, 1], atol=1e-6)
    np.testing.assert_allclose(x[2, COL["dow_sin"]], np.sin(2 * np.pi * 3 / 7), atol=1e-6)
    np.testing.assert_allclose(x[0, [COL["dow_sin"], COL["dow_cos"]]], [0, 1], atol=1e-6)


def test_volume_features_zero_without_volume():
    ts, o, h, l, c, v = random_bars(400)
    vol_cols = [COL["vol_rel_60"], COL["vol_imb_20"], COL["vwap_dev_60"]]
    with_v = compute_features(ts, o, h, l, c, v)
    assert with_v[:, vol_cols].any()
    for none_like in (None, np.zeros(400)):
        x = compute_features(ts, o, h, l, c, none_like)
        assert not x[:, vol_cols].any()
        others = np.setdiff1d(np.arange(42), vol_cols)
        assert np.array_equal(x[:, others], with_v[:, others])


def test_no_look_ahead_bit_identical():
    ts, o, h, l, c, v = random_bars(3000, seed=11)
    base = compute_features(ts, o, h, l, c, v)
    rng = np.random.default_rng(12)
    for t in [0, 1, 59, 60, 119, 120, 255, 256, *rng.integers(121, 2999, 6)]:
        k = rng.uniform(0.5, 2.0, 3000 - t - 1)  # every later bar moved, scaled, re-volumed
        o2, h2, l2, c2, v2 = (a.copy() for a in (o, h, l, c, v))
        for a in (o2, c2):
            a[t + 1 :] *= k
        h2[t + 1 :] = np.maximum(o2[t + 1 :], c2[t + 1 :]) * 1.01
        l2[t + 1 :] = np.minimum(o2[t + 1 :], c2[t + 1 :]) * 0.99
        v2[t + 1 :] = rng.integers(1, 10_000, 3000 - t - 1)
        moved = compute_features(ts, o2, h2, l2, c2, v2)
        assert np.array_equal(moved[: t + 1].view(np.uint32), base[: t + 1].view(np.uint32)), t
        assert not np.array_equal(moved[t + 1 :], base[t + 1 :])  # the perturbation did bite


def test_scale_free_across_price_and_volume_units():
    ts, o, h, l, c, v = random_bars(1500, seed=2)
    base = compute_features(ts, o, h, l, c, v)
    scaled = compute_features(ts, o * 1e4, h * 1e4, l * 1e4, c * 1e4, v * 1e-3)
    np.testing.assert_allclose(scaled, base, rtol=1e-4, atol=1e-6)


def test_warmup_is_long_enough_on_real_bars():
    """Started MAX_LOOKBACK bars back, a feature ~equals its full-history value."""
    if not SIXE.exists():
        pytest.skip("shared 6E bars not available")
    from fxray.data.bars import load_bars

    b = load_bars(SIXE)
    full = compute_features(b.ts, b.open, b.high, b.low, b.close, b.volume)
    scale = full[MAX_LOOKBACK:].std(0) + 1e-12
    cusum = [COL[k] for k in ("cusum_event", "cusum_up", "cusum_down")]
    other = [j for j in range(42) if j not in cusum and j != COL["cusum_rate_60"]]
    same_state = []
    for t in range(2000, len(b), 409):
        s = slice(t - MAX_LOOKBACK, t + 1)
        part = compute_features(b.ts[s], b.open[s], b.high[s], b.low[s], b.close[s], b.volume[s])[-1]
        assert (np.abs(part[other] - full[t, other]) / scale[other]).max() < 0.05, t
        same_state.append(np.array_equal(part[cusum], full[t, cusum]))
    assert np.mean(same_state) > 0.9  # path-dependent by design, but usually forgotten


def test_real_bars_ranges():
    if not SIXE.exists():
        pytest.skip("shared 6E bars not available")
    from fxray.data.bars import load_bars

    b = load_bars(SIXE)
    x = compute_features(b.ts, b.open, b.high, b.low, b.close, b.volume)[MAX_LOOKBACK:]
    assert np.isfinite(x).all()
    assert 0 <= x[:, ADX_INDEX].min() and x[:, ADX_INDEX].max() <= 100 and x[:, ADX_INDEX].mean() > 10
    for name in ("rsi_14", "stoch_k_14", "donchian_60", "close_loc"):
        assert np.abs(x[:, COL[name]]).max() <= 1.0, name
    assert set(np.unique(x[:, COL["cusum_event"]])) == {-1.0, 0.0, 1.0}
    assert 0.005 < np.abs(x[:, COL["cusum_event"]]).mean() < 0.2  # events, not noise


def test_bad_inputs_raise():
    ts, o, h, l, c, v = random_bars(50)
    with pytest.raises(ValueError, match="shape"):
        compute_features(ts[:-1], o, h, l, c, v)
    with pytest.raises(ValueError, match="> 0"):
        compute_features(ts, o, h, l, np.where(np.arange(50) == 7, 0.0, c), v)
    with pytest.raises(ValueError, match="finite"):
        compute_features(ts, o, h, np.where(np.arange(50) == 7, np.nan, l), c, v)
    with pytest.raises(ValueError, match="volume"):
        compute_features(ts, o, h, l, c, v[:-1])


def test_exp_and_log_round_as_the_c_library_on_every_cpu():
    """The market and its features are made of fxray.data.libm's exp and log: the C library's
    bits (math.exp, math.log) whatever numpy's loops on this CPU; numpy's own AVX-512 loop
    rounds ~5 % of exps and ~0.1 % of logs otherwise (on such a CPU, np.exp fails this)."""
    import math

    from fxray.data import libm

    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 3.0, (500, 400))  # 2-D: shapes are kept
    got_exp, got_log = libm.exp(x), libm.log(np.abs(x) + 1e-9)
    assert got_exp.shape == x.shape and got_exp.flags.c_contiguous
    assert got_exp.ravel().tolist() == [math.exp(v) for v in x.ravel().tolist()]
    assert got_log.ravel().tolist() == [math.log(abs(v) + 1e-9) for v in x.ravel().tolist()]
