"""The 8 order-flow features: hand-computed OFI, independent VPIN / Kyle references,
no look-ahead, and an fxcache built from real MBO and Binance data."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("databento_dbn")
pytest.importorskip("numba")
pytest.importorskip("zstandard")

from scipy.special import ndtr  # noqa: E402

from fxray.book.features import bar_starts, trade_pass  # noqa: E402
from fxray.book.reader import (  # noqa: E402
    OFI_NAMES,
    BookSnapshots,
    OfiParams,
    Trades,
    bars_from_trades,
    load_book,
    load_trades,
    ofi_features,
)
from fxray.data import cache  # noqa: E402

ES_DAY = "book/databento/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
BTC = "book/binance_usdm/btcusdt_20240808.gz"
COL = {n: i for i, n in enumerate(OFI_NAMES)}


def book(ts, bids, asks, reset=None):
    """BookSnapshots from per-event [(px, sz), ...] lists (missing levels are empty)."""
    n = len(ts)
    arr = {k: np.zeros((n, 10)) for k in ("bid_sz", "ask_sz")}
    arr["bid_px"], arr["ask_px"] = np.full((n, 10), -np.inf), np.full((n, 10), np.inf)
    for i, (b, a) in enumerate(zip(bids, asks)):
        for j, (px, sz) in enumerate(b):
            arr["bid_px"][i, j], arr["bid_sz"][i, j] = px, sz
        for j, (px, sz) in enumerate(a):
            arr["ask_px"][i, j], arr["ask_sz"][i, j] = px, sz
    reset = np.zeros(n, bool) if reset is None else np.asarray(reset)
    return BookSnapshots(np.asarray(ts, np.int64), reset=reset, **arr)


def test_ofi_level1_matches_hand_computation():
    # e_n = 1{b>=b'}q_b - 1{b<=b'}q_b' - 1{a<=a'}q_a + 1{a>=a'}q_a'   (' = previous event)
    snaps = book(
        ts=[1, 3, 10, 11, 15, 20, 25],
        bids=[[(100.00, 5)], [(100.00, 7)], [(100.10, 3)], [(100.10, 3)], [(100.00, 8)], [(100.00, 8)], [(90.00, 1)]],
        asks=[[(100.25, 4)], [(100.25, 4)], [(100.25, 4)], [(100.20, 6)], [(100.20, 6)], [(100.25, 2)], [(91.00, 1)]],
        reset=[True, False, False, False, False, False, True],
    )
    # n1: bid size 5 -> 7 at the same price: 7 - 5 = +2
    # n2: bid improves to 100.10 x 3: +3 (old best leaves level 1, not subtracted)
    # n3: ask improves to 100.20 x 6: -6
    # n4: best bid falls back to 100.00: -3 (the 3 at 100.10 is gone)
    # n5: ask retreats to 100.25: +6 (the 6 at 100.20 is gone)
    # n6: a reset (new snapshot): no flow across it, however far the book moved
    bar_ts = np.array([10, 20, 30])
    ofi, covered = ofi_features(bar_ts, book=snaps)
    assert ofi[:, COL["ofi_l1"]].tolist() == [2 + 3, -6 - 3 + 6, 0]
    assert covered.tolist() == [True, True, False]  # bar 3 closes after the book's last event
    # chunked delivery gives the same numbers
    chunks = [snaps.select(slice(0, 2)), snaps.select(slice(2, 4)), snaps.select(slice(4, None))]
    assert np.array_equal(ofi_features(bar_ts, book=chunks)[0], ofi)


def test_multilevel_ofi_depth_imbalance_and_slopes_by_hand():
    snaps = book(
        ts=[1, 2],
        bids=[[(10, 4), (9, 6)], [(10, 4), (9, 2)]],
        asks=[[(11, 5), (12, 5)], [(11, 5), (12, 9)]],
        reset=[True, False],
    )
    ofi, covered = ofi_features(np.array([2]), book=snaps, bar_ns=5)  # bar (-3, 2]
    assert covered.tolist() == [True]
    # level 2: bid 6 -> 2 (-4); ask 5 -> 9 (-4); sum -8. Mean depth per level-side:
    # (4+6+5+5)/10 = (4+2+5+9)/10 = 2.0  =>  mlofi = -8 / (5 * 2.0)
    assert ofi[0, COL["mlofi_5"]] == pytest.approx(-0.8)
    assert ofi[0, COL["depth_imb_5"]] == pytest.approx((6 - 14) / 20)
    # slope: cumulative depth vs distance from mid (10.5) in bps; two points each side
    dx = (1.5 - 0.5) / 10.5 * 1e4
    assert ofi[0, COL["bid_slope"]] == pytest.approx((6 - 4) / dx, rel=1e-5)
    assert ofi[0, COL["ask_slope"]] == pytest.approx((14 - 5) / dx, rel=1e-5)


def test_trade_features_match_plain_references():
    rng = np.random.default_rng(0)
    n_bars, bar = 400, 60_000_000_000
    ts = np.sort(rng.integers(1, n_bars * bar, 20_000))
    price = 100 * np.exp(np.cumsum(rng.normal(0, 2e-4, len(ts))))
    trades = Trades(
        ts,
        price,
        rng.integers(1, 20, len(ts)).astype(float),
        rng.choice(np.array([-1, 1], np.int8), len(ts)),
        np.zeros((0, 2), np.int64),
    )
    bar_ts = np.arange(1, n_bars + 1) * bar
    p = OfiParams(vpin_buckets=20, kyle_bars=30)
    got = trade_pass(trades, bar_ts, bar_starts(bar_ts, bar), p)
    # plain per-bar sums
    k = np.searchsorted(bar_ts, ts)
    vol = np.array([trades.size[k == i].sum() for i in range(n_bars)])
    sv = np.array([(trades.size * trades.side)[k == i].sum() for i in range(n_bars)])
    close = np.array([price[k <= i][-1] for i in range(n_bars)])
    dp = np.r_[0.0, 1e4 * np.log(close[1:] / close[:-1])]
    # Kyle: OLS slope of dP on signed volume over the trailing 30 bars (bar 0 has no dP)
    for i in (40, 200, 399):
        lo = max(i - 29, 1)
        slope = np.polyfit(sv[lo : i + 1], dp[lo : i + 1], 1)[0]
        assert got[i, 1] == pytest.approx(slope, rel=1e-9)
    assert np.array_equal(got[:, 2], sv / vol)
    # VPIN: fill equal-volume buckets trade-bar by trade-bar, the way the paper describes
    traded = np.flatnonzero(vol > 0)[:10]
    vb = vol[traded].mean()
    sigma = np.array([np.std(dp[max(i - 49, 1) : i + 1], ddof=1) if i >= 2 else 0 for i in range(n_bars)])
    buy_share = ndtr(np.divide(dp, sigma, out=np.zeros(n_bars), where=sigma > 0))
    buckets, cur_v, cur_b, expect = [], 0.0, 0.0, np.zeros(n_bars)
    for i in range(n_bars):
        v, b = vol[i], vol[i] * buy_share[i]
        while cur_v + v >= vb - 1e-9:  # this bar completes a bucket
            take = vb - cur_v
            cur_b += b * take / v
            buckets.append(abs(2 * cur_b - vb) / vb)
            b, v = b * (1 - take / v), v - take
            cur_v = cur_b = 0.0
        cur_v, cur_b = cur_v + v, cur_b + b
        last = buckets[-20:]
        expect[i] = np.mean(last) if last and i >= traded[-1] else 0.0
    np.testing.assert_allclose(got[:, 0], expect, rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="module")
def es(shared_data):
    path = str(shared_data / ES_DAY)
    trades = load_trades(path)
    bars = bars_from_trades(trades, bar="1min")
    return path, trades, bars, BookSnapshots.concat(load_book([path]))


def test_features_use_nothing_after_the_bar_close(es):
    path, trades, bars, snaps = es
    base, cov = ofi_features(bars.ts, book=snaps, trades=trades)
    # in-memory snapshots cover up to their last event (23:59:59.4): all bars but the last
    assert cov[:-1].all() and (base != 0).any(axis=0).all()  # every feature is live here
    k = 30
    m = (snaps.ts > bars.ts[k])[:, None]  # every book state after bar k's close moves
    moved = BookSnapshots(
        snaps.ts,
        snaps.bid_px + 0.25 * m,
        snaps.bid_sz * (1 + 2 * m),
        snaps.ask_px + 0.25 * m,
        np.where(m, snaps.ask_sz[:, ::-1], snaps.ask_sz),
        snaps.reset,
    )
    t_later = trades.ts > bars.ts[k]
    flipped = Trades(
        trades.ts,
        trades.price * (1 + 0.01 * t_later),
        trades.size * (1 + t_later),
        np.where(t_later, -trades.side, trades.side).astype(np.int8),
        trades.segments,
    )
    after, _ = ofi_features(bars.ts, book=moved, trades=flipped)
    assert np.array_equal(after[: k + 1], base[: k + 1])
    assert (after[k + 1 :] != base[k + 1 :]).any(axis=0).all()  # the perturbation does reach all 8


def test_truncating_the_raw_file_after_a_close_keeps_earlier_bars(es, tmp_path):
    import zstandard

    path, trades, bars, _ = es
    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True).read()
    start = 8 + int.from_bytes(raw[4:8], "little")
    ts_recv = np.frombuffer(raw, np.uint64, offset=start).reshape(-1, 7)[:, 5].astype(np.int64)
    k = 20
    keep = int(np.searchsorted(ts_recv, bars.ts[k], "right"))
    cut = tmp_path / "es_cut.dbn"
    cut.write_bytes(raw[: start + 56 * keep])
    full, _ = ofi_features(bars.ts, book=load_book([path]), trades=trades)
    part, _ = ofi_features(bars.ts, book=load_book([str(cut)]), trades=load_trades(str(cut)))
    assert np.array_equal(part[: k + 1], full[: k + 1])


def test_bars_outside_the_data_are_zero_and_not_covered(es):
    path, trades, bars, _ = es
    minute = 60_000_000_000
    bar_ts = np.r_[bars.ts[0] - 86_400 * 10**9, bars.ts, bars.ts[-1] + 2 * 86_400 * 10**9 + minute]
    ofi, cov = ofi_features(bar_ts, book=load_book([path]), trades=trades, bar_ns=minute)
    assert ofi.dtype == np.float32 and np.isfinite(ofi).all()
    assert not cov[0] and not cov[-1] and cov[1:-1].all()
    assert (ofi[[0, -1]] == 0).all()


def test_bars_from_trades_by_hand():
    s = 1_000_000_000
    t = Trades(
        np.array([1, 59, 60, 61, 185]) * s,
        np.array([5.0, 7, 6, 4, 9]),
        np.array([1.0, 2, 3, 4, 5]),
        np.ones(5, np.int8),
        np.zeros((0, 2), np.int64),
    )
    bars = bars_from_trades(t, "1min")
    assert (bars.ts // s).tolist() == [60, 120, 240]  # (close - 60 s, close]; empty minutes skipped
    assert bars.open.tolist() == [5, 4, 9] and bars.high.tolist() == [7, 4, 9]
    assert bars.low.tolist() == [5, 4, 9] and bars.close.tolist() == [6, 4, 9]
    assert bars.volume.tolist() == [6, 4, 5]


@pytest.mark.parametrize("which", ["es", "btc"])
def test_fxcache_builds_from_real_book_data(shared_data, tmp_path, which):
    path = str(shared_data / (ES_DAY if which == "es" else BTC))
    trades = load_trades(path)
    bar = "1min" if which == "es" else "15s"
    bars = bars_from_trades(trades, bar=bar)
    ofi, covered = ofi_features(bars.ts, book=load_book([path]), trades=trades)
    assert covered.mean() > 0.9 and (ofi[covered] != 0).any(axis=0).sum() >= 6
    out = tmp_path / f"{which}.fxcache"
    cache.write(
        out,
        bars.ts,
        np.zeros((len(bars.ts), cache.N_FEATURES), np.float32),
        ofi,
        np.column_stack([bars.open, bars.high, bars.low, bars.close]),
        feature_names=[f"zero_{i}" for i in range(cache.N_FEATURES)],
        ofi_names=OFI_NAMES,
        instrument=which,
        bar=bar,
        source=path,
    )
    market = cache.open(out)
    assert np.array_equal(market.ofi, ofi) and market.ofi_names == list(OFI_NAMES)
