"""The 8 order-flow features per bar, from book snapshots and trades (docs/ofi.md has the table).

No look-ahead: bar k is the half-open interval (start_k, close_k] with
start_k = max(close_{k-1}, close_k - bar_ns); a feature at bar k uses only events
with ts <= close_k (rolling windows reach back, never forward). Book snapshots
are consumed chunk by chunk (a carried last row joins chunks), so a day of MBO is
never in memory at once. Everything is vectorised numpy: O(events + bars x window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from fxray.book.types import BookError, BookSnapshots, Trades
from fxray.data.bars import Bars
from fxray.data.folds import parse_duration
from fxray.data.libm import log
from fxray.data.schema import OFI_NAMES

BOOK_COLS = (0, 1, 2, 5, 6)  # columns zeroed where the book does not cover a bar
TRADE_COLS = (3, 4, 7)  # columns zeroed where trades do not cover a bar
BPS = 1e4


@dataclass(frozen=True)
class OfiParams:
    """Windows of the order-flow features (bars unless said otherwise)."""

    ofi_levels: int = 5  # levels in multi-level OFI and depth imbalance
    slope_levels: int = 10  # levels in the bid / ask slope regressions
    vpin_buckets: int = 50  # n: VPIN averages the last n volume buckets (Easley et al.)
    vpin_sigma_bars: int = 50  # window of the std of bar price changes used by BVC
    vpin_calib_bars: int = 10  # bucket size = mean volume of the first 10 bars that traded
    vpin_bucket_volume: float | None = None  # fixed bucket size instead (then no calibration)
    kyle_bars: int = 30  # rolling window of the Kyle's lambda regression
    kyle_min_bars: int = 5  # fewer valid bars in the window -> 0


def bars_from_trades(trades: Trades, bar: str = "1min") -> Bars:
    """OHLCV bars from the tape: bar (close - bar, close] on a UTC grid; only bars that traded.
    `bar`: '10s', '1min', '1h' (fxray.data.folds.parse_duration)."""
    bar_ns = parse_duration(bar, "bar")
    if len(trades) == 0:
        raise BookError("bars_from_trades: no trades to make bars from")
    close_ts = -(-trades.ts // bar_ns) * bar_ns  # ceil to the grid: a trade at close belongs to it
    starts = np.flatnonzero(np.r_[True, close_ts[1:] != close_ts[:-1]])
    ends = np.r_[starts[1:], len(close_ts)] - 1
    px = trades.price
    high, low = np.maximum.reduceat(px, starts), np.minimum.reduceat(px, starts)
    return Bars(close_ts[starts], px[starts], high, low, px[ends], np.add.reduceat(trades.size, starts))


# --- bar assignment ------------------------------------------------------------------------


def bar_starts(bar_ts: np.ndarray, bar_ns: int | None) -> np.ndarray:
    """(N,) exclusive start of each bar: max(previous close, close - bar_ns)."""
    if bar_ns is None and len(bar_ts) > 1:
        bar_ns = int(np.median(np.diff(bar_ts)))
    start = np.full(len(bar_ts), np.iinfo(np.int64).min, np.int64) if bar_ns is None else bar_ts - bar_ns
    start[1:] = np.maximum(start[1:], bar_ts[:-1])
    return start


def assign(ts: np.ndarray, bar_ts: np.ndarray, starts: np.ndarray):
    """Bar index of each event and whether it falls inside a bar (not in a gap between bars)."""
    k = np.searchsorted(bar_ts, ts, side="left")  # first bar whose close >= ts
    kc = np.minimum(k, len(bar_ts) - 1)
    return kc, (k < len(bar_ts)) & (ts > starts[kc])


def covered_by(bar_ts: np.ndarray, segments, span=None) -> np.ndarray:
    """(N,) bool: bar close lies in some [start, end] segment (in `span` when there are none)."""
    seg = np.asarray(segments if len(segments) or span is None else [span]).reshape(-1, 2)
    return ((bar_ts[:, None] >= seg[:, 0]) & (bar_ts[:, None] <= seg[:, 1])).any(axis=1)


# --- book features -------------------------------------------------------------------------


def level_ofi(prev: BookSnapshots, cur: BookSnapshots, levels: int) -> np.ndarray:
    """(n, levels) OFI contribution e_n per level (Cont, Kukanov & Stoikov 2014; Xu et al. 2019).

    e = 1{b >= b'} q^b - 1{b <= b'} q^b' - 1{a <= a'} q^a + 1{a >= a'} q^a'  (' = previous event)
    """
    s = np.s_[:, :levels]
    return (
        np.where(cur.bid_px[s] >= prev.bid_px[s], cur.bid_sz[s], 0.0)
        - np.where(cur.bid_px[s] <= prev.bid_px[s], prev.bid_sz[s], 0.0)
        - np.where(cur.ask_px[s] <= prev.ask_px[s], cur.ask_sz[s], 0.0)
        + np.where(cur.ask_px[s] >= prev.ask_px[s], prev.ask_sz[s], 0.0)
    )


def close_features(s: BookSnapshots, p: OfiParams) -> np.ndarray:
    """(n, 3) depth imbalance over `ofi_levels`, bid slope, ask slope of each book state."""
    L = p.ofi_levels
    qb, qa = s.bid_sz[:, :L].sum(1), s.ask_sz[:, :L].sum(1)
    imb = np.divide(qb - qa, qb + qa, out=np.zeros(len(s)), where=(qb + qa) > 0)
    best_b, best_a = s.bid_px[:, 0], s.ask_px[:, 0]
    ok = np.isfinite(best_b) & np.isfinite(best_a) & (best_b + best_a > 0)
    mid = np.where(ok, (best_b + best_a) / 2, 1.0)[:, None]
    Ls = p.slope_levels
    bid_dist, ask_dist = (mid - s.bid_px[:, :Ls]) / mid * BPS, (s.ask_px[:, :Ls] - mid) / mid * BPS
    bid = _slope(np.where(np.isfinite(s.bid_px[:, :Ls]), bid_dist, 0.0), s.bid_sz[:, :Ls], ok)
    ask = _slope(np.where(np.isfinite(s.ask_px[:, :Ls]), ask_dist, 0.0), s.ask_sz[:, :Ls], ok)
    return np.stack([imb, bid, ask], axis=1)


def _slope(dist_bps, size, ok):
    """OLS slope (with intercept) of cumulative depth on distance from mid, per row; 0 if < 2 levels."""
    w = (size > 0) & ok[:, None]
    y = np.cumsum(size, axis=1)
    n = w.sum(1)
    n1 = np.maximum(n, 1)
    xm = (dist_bps * w).sum(1) / n1
    ym = (y * w).sum(1) / n1
    dx = np.where(w, dist_bps - xm[:, None], 0.0)
    sxx = (dx * dx).sum(1)
    sxy = (dx * (y - ym[:, None])).sum(1)
    return np.divide(sxy, sxx, out=np.zeros(len(n)), where=(n >= 2) & (sxx > 1e-12))


def book_pass(chunks, bar_ts, starts, p: OfiParams):
    """Stream the book once: per-bar OFI sums and the book state at each bar close.

    Returns ((N, 5) float64 [ofi_l1, mlofi, depth_imb, bid_slope, ask_slope],
    (N,) bool bar has a book state at close, [first_ts, last_ts] seen or None).
    """
    N, L = len(bar_ts), p.ofi_levels
    sums = np.zeros((4, N))  # ofi_l1, sum over levels of OFI, sum of mean depth, events
    close = np.zeros((N, 3))
    has_state = np.zeros(N, bool)
    carry, first_ts = None, None
    for snap in chunks:
        if len(snap) == 0:
            continue
        if carry is None:  # nothing before the first state: it follows itself, no flow
            first_ts = int(snap.ts[0])
            carry = snap.select(slice(0, 1))
        comb = BookSnapshots.concat([carry, snap])
        e = level_ofi(comb.select(slice(0, -1)), snap, L)
        e[snap.reset] = 0.0
        k, inside = assign(snap.ts, bar_ts, starts)
        depth = (snap.bid_sz[:, :L].sum(1) + snap.ask_sz[:, :L].sum(1)) / (2 * L)
        if inside.any():  # bincount over this chunk's bar range only: O(chunk), not O(N)
            kk = k[inside]
            k0, k1 = kk[0], kk[-1] + 1  # events are in time order, so bars are too
            for row, w in enumerate((e[:, 0], e.sum(1), depth, np.ones(len(snap)))):
                sums[row, k0:k1] += np.bincount(kk - k0, w[inside], minlength=k1 - k0)
        # bars closing in [first row, last row of this chunk): the last state <= close is here;
        # bars closing at/after the last row are settled by the next chunk or the final carry
        _settle(comb, bar_ts, np.searchsorted(bar_ts, snap.ts[-1], "left"), close, has_state, p)
        carry = snap.select(slice(-1, None))
    if carry is None:
        return np.zeros((N, 5)), has_state, None
    _settle(carry, bar_ts, N, close, has_state, p)
    mean_depth = np.divide(sums[2], sums[3], out=np.zeros(N), where=sums[3] > 0)
    mlofi = np.divide(sums[1], L * mean_depth, out=np.zeros(N), where=mean_depth > 0)
    return np.column_stack([sums[0], mlofi, close]), has_state, (first_ts, int(carry.ts[0]))


def _settle(comb, bar_ts, hi, close, has_state, p):
    """The book state at the close of each bar closing in [comb's first row, bar hi)."""
    lo = np.searchsorted(bar_ts, comb.ts[0], "left")
    if hi <= lo:
        return
    j = np.searchsorted(comb.ts, bar_ts[lo:hi], "right") - 1
    close[lo:hi] = close_features(comb.select(j), p)
    has_state[lo:hi] = True


# --- trade features ------------------------------------------------------------------------


def _window_sum(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing sum over the last w bars (incl. current); direct convolution, so each value
    depends only on its own window (bit-identical when later bars change)."""
    return np.convolve(x, np.ones(w))[: len(x)]


def trade_pass(trades: Trades, bar_ts, starts, p: OfiParams) -> np.ndarray:
    """(N, 3) [vpin, kyle_lambda, trade_imb] per bar."""
    N = len(bar_ts)
    k, inside = assign(trades.ts, bar_ts, starts)
    k, size, side = k[inside], trades.size[inside], trades.side[inside]
    vol, buy, sell = (np.bincount(k, w, minlength=N) for w in (size, size * (side > 0), size * (side < 0)))
    trade_imb = np.divide(buy - sell, buy + sell, out=np.zeros(N), where=(buy + sell) > 0)

    # price at each close = last trade at or before it; dP in bps between consecutive closes
    last = np.searchsorted(trades.ts, bar_ts, "right") - 1
    px = np.where(last >= 0, trades.price[np.maximum(last, 0)], np.nan)
    ok = np.isfinite(px) & (px > 0)
    valid = np.r_[False, ok[1:] & ok[:-1]]
    dp = np.zeros(N)
    dp[1:] = BPS * log(np.where(valid[1:], px[1:] / np.where(valid[1:], px[:-1], 1.0), 1.0))

    # Kyle's lambda: Cov_W(dP, S) / Var_W(S), S = signed volume of the bar
    sv = np.where(valid, buy - sell, 0.0)
    n = _window_sum(valid.astype(np.float64), p.kyle_bars)
    n1 = np.maximum(n, 1)
    ms, mp, ms2 = (_window_sum(x, p.kyle_bars) / n1 for x in (sv, dp, sv * sv))
    var = ms2 - ms * ms
    cov = _window_sum(sv * dp, p.kyle_bars) / n1 - ms * mp
    kyle = np.divide(cov, var, out=np.zeros(N), where=(n >= p.kyle_min_bars) & (var > 1e-12 * ms2) & (var > 0))

    vpin = _vpin(vol, dp, valid, p)
    return np.column_stack([vpin, kyle, trade_imb])


def _vpin(vol, dp, valid, p: OfiParams) -> np.ndarray:
    """VPIN with bulk volume classification over the bars (Easley, Lopez de Prado & O'Hara 2012)."""
    N = len(vol)
    w = p.vpin_sigma_bars
    n = _window_sum(valid.astype(np.float64), w)
    mean = _window_sum(dp, w) / np.maximum(n, 1)
    var = (_window_sum(dp * dp, w) - n * mean * mean) / np.maximum(n - 1, 1)
    sigma = np.sqrt(np.maximum(var, 0.0))
    z = np.divide(dp, sigma, out=np.zeros(N), where=(n >= 2) & (sigma > 0))
    buy = vol * ndtr(z)  # BVC: share of the bar's volume classified as buys
    if p.vpin_bucket_volume is not None:
        vb, k_calib = float(p.vpin_bucket_volume), 0
    else:  # calibrate on the first bars that traded; VPIN is 0 until then (no look-ahead)
        traded = np.flatnonzero(vol > 0)
        if len(traded) < p.vpin_calib_bars:
            return np.zeros(N)
        k_calib = int(traded[p.vpin_calib_bars - 1])
        vb = float(vol[traded[: p.vpin_calib_bars]].mean())
    if vb <= 0:
        return np.zeros(N)
    cum_v, cum_b = np.cumsum(vol), np.cumsum(buy)
    edges = np.arange(int(cum_v[-1] // vb) + 2) * vb
    edges = edges[edges <= cum_v[-1]]
    b_at = np.interp(edges, np.r_[0.0, cum_v[vol > 0]], np.r_[0.0, cum_b[vol > 0]])
    imb = np.abs(2 * np.diff(b_at) - vb) / vb  # |V_B - V_S| / V per bucket
    cum_imb = np.r_[0.0, np.cumsum(imb)]
    done = np.searchsorted(edges, cum_v, "right") - 1  # completed buckets at each close
    lo = np.maximum(done - p.vpin_buckets, 0)
    out = np.divide(cum_imb[done] - cum_imb[lo], done - lo, out=np.zeros(N), where=done > lo)
    out[:k_calib] = 0.0
    return out


# --- entry point ---------------------------------------------------------------------------


def ofi_features(
    bar_ts, book=None, trades: Trades | None = None, *, bar_ns: int | None = None, params: OfiParams = OfiParams()
):
    """(N, 8) float32 order-flow features (columns OFI_NAMES) and (N,) bool coverage.

    bar_ts  (N,) int64 bar close times, ns, strictly increasing.
    book    a BookStream (from load_book), a BookSnapshots, an iterable of them, or None.
    trades  Trades (from load_trades) or None.
    bar_ns  bar length; default the median spacing of bar_ts.
    A bar is covered when its close lies in the span of every source given; book
    columns are 0 where the book does not cover a bar, trade columns 0 where the
    trades do not, so the result is finite everywhere.
    """
    bar_ts = np.asarray(bar_ts, np.int64)
    N = len(bar_ts)
    starts = bar_starts(bar_ts, bar_ns)
    out = np.zeros((N, len(OFI_NAMES)))
    covered = np.zeros(N, bool) if book is None and trades is None else np.ones(N, bool)
    if book is not None:
        chunks = [book] if isinstance(book, BookSnapshots) else book
        feats, has_state, span = book_pass(chunks, bar_ts, starts, params)
        cov = covered_by(bar_ts, getattr(book, "segments", ()), span) & has_state  # a BookStream's, once iterated
        out[:, BOOK_COLS] = np.where(cov[:, None], feats, 0.0)
        covered &= cov
    if trades is not None:
        cov = covered_by(bar_ts, trades.segments, trades.ts[[0, -1]] if len(trades) else None)
        if len(trades):
            out[:, TRADE_COLS] = np.where(cov[:, None], trade_pass(trades, bar_ts, starts, params), 0.0)
        covered &= cov
    return out.astype(np.float32), covered
