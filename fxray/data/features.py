"""Bar features: OHLC(V) bars -> a (N, 42) float32 matrix known at each bar's close.

Every feature is scale-free (a log return, a ratio, an oscillator in a fixed range)
so one model can read several instruments. `FEATURE_TABLE` documents each one
(name, formula, lookback in bars, source); `docs/features.md` is the same table.

Conventions
- t is a bar index; C, O, H, L, V are close/open/high/low/volume; r_t = ln(C_t/C_{t-1}).
- No look-ahead: features[t] reads bars <= t only (rolling windows are trailing,
  recursions are causal `lfilter`s, nothing is normalised over the whole series).
- Warm-up: feature j is 0 (neutral) for t < its lookback L_j. For EMA/Wilder
  recursions L_j is the *effective* lookback: the bars after which the seed's weight
  (1 - alpha)^k has fallen below ~1e-3 (Wilder 14: ~94 bars after its seed; EMA 26:
  ~90 bars), so a feature at t >= L_j barely depends on where the history started.
  `MAX_LOOKBACK` = max L_j; cache builders drop the first MAX_LOOKBACK rows and the
  walk-forward embargo uses it. The CUSUM state is path-dependent by design (AFML): it
  forgets its start only at its first floor or reset, so started 120 bars back it
  matches the full-history state ~97% of the time on the shared data (the 60-bar event
  count ~75%); every other feature is within ~1e-2 of its std (tests check both).
- Oscillators whose neutral value is not 0 are centred (RSI -> (RSI - 50)/50,
  %B -> %B - 1/2, ...). +DI, -DI and ADX stay in Wilder's points (0..100): 0 is
  neutral for them and `fxray.rl.device` reads raw ADX (index 40) as fold difficulty.

Speed (~1.4M bars/s of CPU on one core here): numpy + `scipy.signal.lfilter` for the
recursions + `scipy.ndimage` for rolling max/min; the CUSUM reset recursion runs
chunk-parallel (`cusum_filter`). No per-bar Python loop.
"""

from __future__ import annotations

import math

import numpy as np

from fxray.data.calendar import DAY_NS, WEEK_NS
from fxray.data.libm import log
from fxray.data.schema import ADX_INDEX, CALENDAR_INDICES, N_FEATURES

# scipy (~0.6-1 s to import) is imported where it is used: the sweep driver reads
# FEATURE_NAMES / MAX_LOOKBACK (the default market's cache key) on its start-up path.

_W, _AFML, _LD = "Wilder 1978", "Lopez de Prado 2018 (AFML)", "-"  # the sources cited most
_CU, _EA = _AFML + " 2.5.2.1", "Easley et al. 2012 (bar flavour)"
# (name, formula, lookback in bars, source); rows t < lookback are 0.
FEATURE_TABLE: tuple[tuple[str, str, int, str], ...] = (
    ("ret_1", "ln(C_t / C_{t-1})", 1, _LD),
    ("ret_2", "ln(C_t / C_{t-2})", 2, _LD),
    ("ret_5", "ln(C_t / C_{t-5})", 5, _LD),
    ("ret_10", "ln(C_t / C_{t-10})", 10, _LD),
    ("ret_20", "ln(C_t / C_{t-20})", 20, _LD),
    ("ret_60", "ln(C_t / C_{t-60})", 60, _LD),
    ("hl_range", "ln(H_t / L_t)", 0, _LD),
    ("body", "ln(C_t / O_t)", 0, _LD),
    ("close_loc", "(C_t - L_t)/(H_t - L_t) - 1/2 (0 if H = L)", 0, _LD),
    ("gap", "ln(O_t / C_{t-1})", 1, _LD),
    ("rv_10", "sqrt(mean of r^2 over the last 10 bars)", 10, "Andersen & Bollerslev 1998"),
    ("rv_30", "sqrt(mean of r^2 over the last 30 bars)", 30, "Andersen & Bollerslev 1998"),
    ("rv_60", "sqrt(mean of r^2 over the last 60 bars)", 60, "Andersen & Bollerslev 1998"),
    ("pk_10", "sqrt(mean of ln(H/L)^2 over 10 bars / (4 ln 2))", 9, "Parkinson 1980"),
    ("pk_30", "sqrt(mean of ln(H/L)^2 over 30 bars / (4 ln 2))", 29, "Parkinson 1980"),
    ("pk_60", "sqrt(mean of ln(H/L)^2 over 60 bars / (4 ln 2))", 59, "Parkinson 1980"),
    ("rv_ratio", "ln(rv_10 / rv_60) (0 if either is 0)", 60, _LD),
    ("ma_dev_20", "ln(C_t / SMA20(C))", 19, _LD),
    ("ma_dev_60", "ln(C_t / SMA60(C))", 59, _LD),
    ("donchian_60", "(C - min L_60)/(max H_60 - min L_60) - 1/2", 59, "Donchian 1960"),
    ("stoch_k_14", "(C - min L_14)/(max H_14 - min L_14) - 1/2", 13, "Lane 1950s"),
    ("rsi_14", "(RSI14 - 50)/50; Wilder averages seeded by the SMA of the first 14", 110, _W),
    ("macd", "(EMA12(C) - EMA26(C)) / C_t; EMAs seeded at the first close", 100, "Appel 1979"),
    ("macd_signal", "EMA9(MACD) / C_t", 110, "Appel 1979"),
    ("macd_hist", "(MACD - EMA9(MACD)) / C_t", 110, "Appel 1979"),
    ("bb_pctb_20", "%B - 1/2; %B = (C - lower)/(upper - lower), SMA20 +- 2 sigma (ddof 0)", 19, "Bollinger 2001"),
    ("bb_width_20", "(upper - lower) / SMA20 = 4 sigma20 / SMA20", 19, "Bollinger 2001"),
    ("cusum_event", "+1 / -1 on a CUSUM up / down event at t, else 0; h_t = 5 rv_60", 60, _CU),
    ("cusum_up", "S+_t / h_t after reset, in [0, 1]", 60, _CU),
    ("cusum_down", "S-_t / h_t after reset, in [-1, 0]", 60, _CU),
    ("cusum_rate_60", "number of CUSUM events (either side) in the last 60 bars / 60", 119, _AFML),
    ("vol_rel_60", "ln((V_t + m) / (2 m)), m = mean V over 60 bars (0 if m = 0)", 59, _LD),
    ("vol_imb_20", "sum sign(C - O) V / sum V over 20 bars (0 if no volume)", 19, _EA),
    ("vwap_dev_60", "ln(C_t / VWAP60), VWAP of (H + L + C)/3 (0 if no volume)", 59, _LD),
    ("tod_sin", "sin(2 pi x time of day of the bar close, UTC)", 0, _LD),
    ("tod_cos", "cos(2 pi x time of day of the bar close, UTC)", 0, _LD),
    ("dow_sin", "sin(2 pi x fraction of the week since Monday 00:00 UTC)", 0, _LD),
    ("dow_cos", "cos(2 pi x fraction of the week since Monday 00:00 UTC)", 0, _LD),
    ("plus_di_14", "+DI14 = 100 +DM14 / TR14 (Wilder sums), points 0..100", 110, _W),
    ("minus_di_14", "-DI14 = 100 -DM14 / TR14 (Wilder sums), points 0..100", 110, _W),
    ("adx_14", "Wilder average of DX = 100 |+DI - -DI|/(+DI + -DI), points 0..100", 120, _W),
    ("atr_14", "ATR14 / C_t; TR Wilder-averaged, seeded by the SMA of the first 14 TR", 110, _W),
)
FEATURE_NAMES: tuple[str, ...] = tuple(row[0] for row in FEATURE_TABLE)
LOOKBACKS: tuple[int, ...] = tuple(row[2] for row in FEATURE_TABLE)
MAX_LOOKBACK = max(LOOKBACKS)  # 120 bars
CUSUM_H = 5.0  # CUSUM threshold in units of rv_60 (per-bar sigma)
assert len(FEATURE_NAMES) == N_FEATURES and FEATURE_NAMES[ADX_INDEX] == "adx_14"
assert tuple(FEATURE_NAMES[i] for i in CALENDAR_INDICES) == ("tod_sin", "tod_cos", "dow_sin", "dow_cos")

# --- rolling helpers (trailing windows; NaN before the first full window) -----------


def _rolling_sum(x: np.ndarray, w: int, cs: np.ndarray | None = None) -> np.ndarray:
    """sum of x[t-w+1 .. t] (pass cs = cumsum(x) to share it between windows).
    A float64 cumsum is sequential, so out[t] reads x[:t+1] only."""
    out = np.full(len(x), np.nan)
    if len(x) >= w:
        cs = np.cumsum(x) if cs is None else cs
        out[w - 1] = cs[w - 1]
        np.subtract(cs[w:], cs[:-w], out=out[w:])
    return out


def _rolling_extreme(x: np.ndarray, w: int, kind: str) -> np.ndarray:
    """max or min of x[t-w+1 .. t] in O(N): scipy's centred filter, shifted to trail."""
    from scipy.ndimage import maximum_filter1d, minimum_filter1d

    out = np.full(len(x), np.nan)
    if len(x) >= w:
        f = maximum_filter1d if kind == "max" else minimum_filter1d
        centred = f(x, w, mode="nearest")  # window [j - w//2, j - w//2 + w - 1]
        s = w - 1 - w // 2
        out[w - 1 :] = centred[w - 1 - s : len(x) - s]
    return out


def _ratio(num: np.ndarray, den: np.ndarray, where_zero: float = 0.0) -> np.ndarray:
    """num/den with `where_zero` where den == 0 (NaN stays NaN: it marks the warm-up)."""
    out = np.full(np.shape(num), where_zero)
    return np.divide(num, den, out=out, where=den != 0)


# --- recursions ------------------------------------------------------------------------


def ema(x, span: float, *, init: float | None = None):
    """y_t = alpha x_t + (1 - alpha) y_{t-1}, y_0 = init (default x_0); alpha = 2/(span+1)."""
    from scipy.signal import lfilter

    x = np.asarray(x, np.float64)
    a = 2.0 / (span + 1.0)
    y = np.empty_like(x)
    if len(x) == 0:
        return y
    y[0] = x[0] if init is None else init
    y[1:] = lfilter([a], [1.0, a - 1.0], x[1:], zi=[(1.0 - a) * y[0]])[0]
    return y


def wilder(x, n: int, start: int, seed: float, *, total: bool = False) -> np.ndarray:
    """Wilder smoothing seeded with `seed` at index `start` (NaN before).

    average form: avg_t = ((n-1) avg_{t-1} + x_t)/n;  total=True, the sum form used for
    TR14 / DM14: S_t = S_{t-1} - S_{t-1}/n + x_t (= n x the average form).
    """
    from scipy.signal import lfilter

    x = np.asarray(x, np.float64)
    out = np.full(len(x), np.nan)
    if start < len(x):
        p = 1.0 - 1.0 / n
        out[start] = seed
        out[start + 1 :] = lfilter([1.0 if total else 1.0 / n], [1.0, -p], x[start + 1 :], zi=[p * seed])[0]
    return out


# --- classic indicators (raw units, NaN before they are defined) -----------------------


def rsi(close, n: int = 14) -> np.ndarray:
    """Wilder's RSI in points (0..100), defined from index n: average gain/loss seeded at
    t=n by the mean of the first n changes (Wilder 1978)."""
    c = np.asarray(close, np.float64)
    d = np.diff(c, prepend=c[:1])  # d_0 = 0
    gain, loss = np.maximum(d, 0.0), np.maximum(-d, 0.0)
    g0, l0 = (gain[1 : n + 1].mean(), loss[1 : n + 1].mean()) if len(c) > n else (0.0, 0.0)
    avg_gain, avg_loss = wilder(gain, n, n, g0), wilder(loss, n, n, l0)
    out = 100.0 * _ratio(avg_gain, avg_gain + avg_loss, where_zero=0.5)  # = 100 - 100/(1+RS)
    out[:n] = np.nan
    return out


def true_range(high, low, close) -> np.ndarray:
    """TR_t = max(H-L, |H - C_{t-1}|, |L - C_{t-1}|); TR_0 = H_0 - L_0."""
    h, l, c = (np.asarray(a, np.float64) for a in (high, low, close))
    prev = np.concatenate([c[:1], c[:-1]])
    tr = np.maximum(h - l, np.maximum(np.abs(h - prev), np.abs(l - prev)))
    tr[:1] = h[:1] - l[:1]
    return tr


def atr(high, low, close, n: int = 14, *, tr=None) -> np.ndarray:
    """Wilder ATR seeded at t=n-1 by the mean of TR_0..TR_{n-1} (cs-atr.csv; n=10: cs-atr2.csv).
    `tr`: true_range(high, low, close) if already computed."""
    tr = true_range(high, low, close) if tr is None else tr
    return wilder(tr, n, n - 1, tr[:n].mean() if len(tr) >= n else 0.0)


def adx(high, low, close, n: int = 14, *, tr=None):
    """Wilder's directional system -> (+DI, -DI, ADX) in points, NaN before defined.

    +DM/-DM and TR from t=1; TR14/DM14 are Wilder sums seeded at t=n by the sum of
    the first n; DX from t=n; ADX seeded at t=2n-1 by the mean of DX_n..DX_{2n-1}.
    """
    h, l = np.asarray(high, np.float64), np.asarray(low, np.float64)
    up = np.diff(h, prepend=h[:1])  # H_t - H_{t-1}
    down = -np.diff(l, prepend=l[:1])  # L_{t-1} - L_t
    plus_dm = np.where((up > down) & (up > 0), up, 0.0)
    minus_dm = np.where((down > up) & (down > 0), down, 0.0)
    tr = true_range(h, l, close) if tr is None else tr
    sums = [wilder(x, n, n, x[1 : n + 1].sum(), total=True) for x in (tr, plus_dm, minus_dm)]
    plus_di, minus_di = (100.0 * _ratio(dm, sums[0]) for dm in sums[1:])
    dx = 100.0 * _ratio(np.abs(plus_di - minus_di), plus_di + minus_di)
    seed = dx[n : 2 * n].mean() if len(dx) >= 2 * n else 0.0
    return plus_di, minus_di, wilder(dx, n, 2 * n - 1, seed)


def macd(close, fast: int = 12, slow: int = 26, signal: int = 9):
    """MACD (Appel) in price units -> (line, signal, hist); EMAs seeded at the first close,
    the signal EMA at line_0 = 0 (cs-macd.csv seeds it otherwise: a 0.8^t transient)."""
    c = np.asarray(close, np.float64)
    line = ema(c, fast) - ema(c, slow)
    sig = ema(line, signal)
    return line, sig, line - sig


def bollinger(close, n: int = 20, k: float = 2.0):
    """-> (mid, upper, lower): SMA_n +- k sigma_n, population sigma (ddof=0)."""
    c = np.asarray(close, np.float64)
    mid = _rolling_sum(c, n) / n
    var = np.full(len(c), np.nan)
    if len(c) >= n:
        # Two-pass variance over the n lags (exact; a cumsum of C^2 would cancel
        # catastrophically at price levels ~1e3 with sigma ~1): n vector passes.
        m, acc, tmp = mid[n - 1 :], np.zeros(len(c) - n + 1), np.empty(len(c) - n + 1)
        for lag in range(n):
            np.subtract(c[lag : len(c) - n + 1 + lag], m, out=tmp)
            np.multiply(tmp, tmp, out=tmp)
            acc += tmp
        var[n - 1 :] = acc / n
    sd = np.sqrt(var)
    return mid, mid + k * sd, mid - k * sd


def bollinger_pctb(close, n: int = 20, k: float = 2.0, *, bands=None) -> np.ndarray:
    """%B = (C - lower)/(upper - lower); 1/2 where the band has no width (flat prices).
    `bands`: (mid, upper, lower) already computed by `bollinger(close, n, k)`."""
    c = np.asarray(close, np.float64)
    mid, upper, lower = bollinger(c, n, k) if bands is None else bands
    width = upper - lower
    flat = width <= 1e-10 * np.abs(mid)  # a rounding-level sigma is no band at all
    return np.where(flat, 0.5, (c - lower) / np.where(flat, 1.0, width))


# --- CUSUM filter (AFML 2.5.2.1) ------------------------------------------------------


def cusum_filter(y, h):
    """Two-sided CUSUM with reset: S+_t = max(0, S+_{t-1} + y_t), S-_t = min(0, S-_{t-1} + y_t);
    when S+_t > h_t an up event fires and S+_t = 0 (S- likewise, each side on its own).

    -> (s_pos, s_neg, event) with event in {-1, 0, +1} (up minus down).
    Chunk-parallel, no per-bar Python loop: the series is cut into m chunks of c <= 256
    bars and all chunks advance together (a loop over c positions of (m,) vectors). Chunk
    k's true start state is chunk k-1's end state: rerun the chunks whose start state
    was wrong, each only until its path merges with the previous pass (both hit 0 at a
    floor or a reset, typically within a few bars), and repeat until no start state
    changes. The result is bit-identical to the sequential recursion (same float ops in
    the same order) whatever the chunking; worst case (no merge) is ~N Python steps.
    """
    y, h = np.asarray(y, np.float64), np.asarray(h, np.float64)
    n = len(y)
    # c positions x m chunks: Python steps ~ c, vector length ~ m (cost ~ 6c us + 10n ns).
    c = int(min(256, max(1, n)))
    m = -(-n // c)
    pad = m * c - n
    # The down side runs mirrored, -S-_t = max(0, -S-_{t-1} - y_t) (negation is exact in
    # IEEE arithmetic), so both sides share one max/compare/reset: state z is (2, m).
    yy = np.ascontiguousarray(np.concatenate([y, np.zeros(pad)]).reshape(m, c).T)  # (c, m)
    hh = np.ascontiguousarray(np.concatenate([h, np.full(pad, np.inf)]).reshape(m, c).T)  # (c, m)
    z_all = np.empty((c, 2, m))  # state after bar j of every chunk
    fired = np.empty((c, 2, m), bool)

    # First pass: every chunk from a zero start state, straight into the outputs.
    z = np.zeros((2, m))
    for j in range(c):
        np.add(z[0], yy[j], out=z[0])
        np.subtract(z[1], yy[j], out=z[1])
        np.maximum(z, 0.0, out=z)
        np.greater(z, hh[j], out=fired[j])
        z[fired[j]] = 0.0  # reset the side that fired
        z_all[j] = z
    start = np.zeros((2, m))
    while True:  # fix-up sweeps: rerun chunks whose start state was wrong (usually 1-2)
        want = np.concatenate([np.zeros((2, 1)), z_all[-1, :, :-1]], axis=1)
        active = np.flatnonzero((want != start).any(axis=0))
        if len(active) == 0:
            break
        start[:, active] = want[:, active]
        z = want[:, active]
        for j in range(c):
            step = yy[j, active]
            z = np.maximum(np.stack([z[0] + step, z[1] - step]), 0.0)
            f = z > hh[j][active]
            z[f] = 0.0
            merged = (z == z_all[j][:, active]).all(axis=0)  # same state: same path from here
            z_all[j][:, active], fired[j][:, active] = z, f
            if merged.any():
                active, z = active[~merged], z[:, ~merged]
                if len(active) == 0:
                    break
    s_pos = z_all[:, 0].T.ravel()[:n]
    s_neg = -z_all[:, 1].T.ravel()[:n]
    event = fired[:, 0].T.ravel()[:n].view(np.int8) - fired[:, 1].T.ravel()[:n].view(np.int8)
    return s_pos, s_neg, event


# --- the feature matrix ---------------------------------------------------------------


def compute_features(ts, open, high, low, close, volume=None) -> np.ndarray:  # noqa: A002
    """Bars (N,) -> features (N, 42) float32, finite everywhere, in FEATURE_NAMES order.

    ts: int64 ns UTC bar close times; prices > 0 and finite (float64); volume: (N,)
    or None (volume features are then 0, as they are for all-zero volume).
    """
    ts = np.asarray(ts, np.int64)
    o, h, l, c = (np.asarray(a, np.float64) for a in (open, high, low, close))
    n = len(c)
    if any(a.shape != (n,) for a in (ts, o, h, l)):
        raise ValueError(f"compute_features: ts/open/high/low/close must all have shape ({n},)")
    if n and not (np.isfinite(o + h + l + c).all() and min(o.min(), h.min(), l.min(), c.min()) > 0):
        raise ValueError("compute_features: prices must be finite and > 0 (clean the bars first)")
    v = None if volume is None else np.asarray(volume, np.float64)
    if v is not None and (v.shape != (n,) or not np.isfinite(v).all()):
        raise ValueError(f"compute_features: volume must be finite with shape ({n},)")
    out = np.zeros((N_FEATURES, n), np.float32)  # feature-major while filling: contiguous rows
    index = {name: j for j, name in enumerate(FEATURE_NAMES)}

    def put(name, values):
        j = index[name]
        out[j] = values
        out[j, : LOOKBACKS[j]] = 0.0  # warm-up: neutral

    if n == 0:
        return out.T.copy()
    lc, lo, lh, ll = log(c), log(o), log(h), log(l)
    r = np.diff(lc, prepend=lc[:1])  # r_0 = 0
    for k in (1, 2, 5, 10, 20, 60):
        col = np.zeros(n)
        col[k:] = lc[k:] - lc[:-k]
        put(f"ret_{k}", col)

    # --- bar shape, volatility ---
    hl = lh - ll
    put("hl_range", hl)
    put("body", lc - lo)
    put("close_loc", _ratio(c - l, h - l, where_zero=0.5) - 0.5)
    put("gap", lo - np.concatenate([lc[:1], lc[:-1]]))
    r2, pk2 = r * r, hl * hl / (4.0 * math.log(2.0))
    rv, cs_r2, cs_pk2 = {}, np.cumsum(r2), np.cumsum(pk2)
    for w in (10, 30, 60):
        rv[w] = np.sqrt(np.maximum(_rolling_sum(r2, w, cs_r2) / w, 0.0))
        put(f"rv_{w}", rv[w])
        put(f"pk_{w}", np.sqrt(np.maximum(_rolling_sum(pk2, w, cs_pk2) / w, 0.0)))
    both = (rv[10] > 0) & (rv[60] > 0)
    put("rv_ratio", np.where(both, log(_ratio(rv[10], np.where(both, rv[60], 0.0), 1.0)), 0.0))

    # --- trend, oscillators ---
    cs_c = np.cumsum(c)
    for w in (20, 60):
        put(f"ma_dev_{w}", lc - log(_rolling_sum(c, w, cs_c) / w))
    for name, w in (("donchian_60", 60), ("stoch_k_14", 14)):
        hh, lo_ = _rolling_extreme(h, w, "max"), _rolling_extreme(l, w, "min")
        put(name, _ratio(c - lo_, hh - lo_, where_zero=0.5) - 0.5)
    put("rsi_14", (rsi(c, 14) - 50.0) / 50.0)
    for name, x in zip(("macd", "macd_signal", "macd_hist"), macd(c)):
        put(name, x / c)
    bands = mid, upper, lower = bollinger(c, 20, 2.0)
    put("bb_pctb_20", bollinger_pctb(c, 20, 2.0, bands=bands) - 0.5)
    put("bb_width_20", (upper - lower) / mid)

    # --- CUSUM events: threshold h_t = CUSUM_H x rv_60 (no events until rv_60 exists) ---
    sigma = np.nan_to_num(rv[60], nan=0.0)
    thresh = np.where(sigma > 0, CUSUM_H * sigma, np.inf)
    s_pos, s_neg, event = cusum_filter(r, thresh)
    scale = np.where(np.isfinite(thresh), thresh, 1.0)
    put("cusum_event", event)
    put("cusum_up", np.where(np.isfinite(thresh), s_pos / scale, 0.0))
    put("cusum_down", np.where(np.isfinite(thresh), s_neg / scale, 0.0))
    put("cusum_rate_60", _rolling_sum(np.abs(event).astype(np.float64), 60) / 60.0)

    # --- volume (zeros without it) ---
    if v is not None and v.any():
        vsum60 = _rolling_sum(v, 60)
        m60 = vsum60 / 60.0
        put("vol_rel_60", log(_ratio(v + m60, 2.0 * m60, where_zero=1.0)))  # 0 where m60 = 0
        put("vol_imb_20", _ratio(_rolling_sum(np.sign(c - o) * v, 20), _rolling_sum(v, 20)))
        vwap = _ratio(_rolling_sum((h + l + c) / 3.0 * v, 60), vsum60)
        put("vwap_dev_60", np.where(vwap > 0, lc - log(np.where(vwap > 0, vwap, 1.0)), 0.0))

    # --- calendar (UTC, from the bar close time) ---
    # float32 phases: sin/cos run ~10x faster and the output is float32 anyway (~5 ms)
    day = ((ts % DAY_NS) / DAY_NS * (2.0 * np.pi)).astype(np.float32)
    # 1970-01-01 was a Thursday: + 3 days puts Monday 00:00 at phase 0
    week = ((ts + 3 * DAY_NS) % WEEK_NS / WEEK_NS * (2.0 * np.pi)).astype(np.float32)
    for j, x in zip(CALENDAR_INDICES, (np.sin(day), np.cos(day), np.sin(week), np.cos(week))):
        out[j] = x  # tod_sin, tod_cos, dow_sin, dow_cos: no warm-up

    # --- Wilder's directional system and ATR ---
    tr = true_range(h, l, c)
    for name, x in zip(("plus_di_14", "minus_di_14", "adx_14"), adx(h, l, c, 14, tr=tr)):
        put(name, x)
    put("atr_14", atr(h, l, c, 14, tr=tr) / c)

    # Short series leave NaN (an undefined window) past a lookback: make them neutral.
    if not np.isfinite(out.sum()):  # float32 pairwise sum: one cheap pass
        np.nan_to_num(out, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    return np.ascontiguousarray(out.T)  # (N, 42) row-major, what fxcache stores
