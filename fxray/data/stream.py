"""The 42 bar features one bar at a time: the streaming twin of fxray.data.features.

    stream = FeatureStream()
    for bar in bars:                            # in time order, from the first bar of a history
        row = stream.update(ts, o, h, l, c, v)  # (42,) float32, FEATURE_NAMES order
        stream.ready                            # True once every lookback is behind it

Contract: fed the bars of a history from its first bar, row t equals
`compute_features(history)[t]` exactly (==, every element; tests/test_stream.py checks it
on the shared EURUSD and CME 6E bars). It is the same arithmetic in the same order, not a
re-derivation: the rolling sums are differences of running float64 cumsums (what
`_rolling_sum` does), the EMA / Wilder recursions are the two float operations of
scipy's `lfilter` for a first-order filter, the Wilder seeds are numpy means/sums of the
same values, the CUSUM is the sequential recursion `cusum_filter` is bit-identical to,
every log is fxray.data.libm's (the C library's, as the batch's) and every sin / cos numpy's.
What it keeps per bar is O(1): ring buffers of the last 61 values, a few scalars, and the
first 28 bars' values for the Wilder seeds.

Like the batch features, the state depends on where the history starts (EMAs, Wilder
sums, CUSUM): a stream started at another bar than the cache builder's reaches the same
features only after the warm-up (`MAX_LOOKBACK` bars, within ~1e-2 of a std; docs/features.md).

Each `update` checks its bar first and raises `StreamError` (one line) before changing
any state: a time not after the previous bar's, a price that is not finite and > 0, a
volume that is not finite and >= 0. Cost: ~20-30 us of CPU per bar (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from fxray.data.calendar import DAY_NS, WEEK_NS
from fxray.data.features import CUSUM_H, FEATURE_NAMES, LOOKBACKS, MAX_LOOKBACK
from fxray.data.libm import log
from fxray.data.schema import CALENDAR_INDICES, N_FEATURES

_PK = 4.0 * math.log(2.0)  # the batch's constant, computed the batch's way
_TWO_PI = 2.0 * np.pi
_N = 14  # Wilder's period (RSI, DI, ADX, ATR)
_P = 1.0 - 1.0 / _N  # Wilder's decay, as fxray.data.features.wilder computes it
_B = 1.0 / _N  # the average form's input weight
_A12, _A26, _A9 = (2.0 / (span + 1.0) for span in (12, 26, 9))
_NAN = float("nan")
_INDEX = {name: j for j, name in enumerate(FEATURE_NAMES)}
_RETURNS = tuple((k, _INDEX[f"ret_{k}"]) for k in (1, 2, 5, 10, 20, 60))
_VOL = tuple((w, _INDEX[f"rv_{w}"], _INDEX[f"pk_{w}"]) for w in (10, 30, 60))
_KEEP = 61  # values kept per series: x_t .. x_{t-60}


class StreamError(ValueError):
    """A bar a stream cannot take; the message is one line naming the field."""


class _Cumsum:
    """A running float64 cumsum and its last `_KEEP` values: rolling sums as the batch's
    `_rolling_sum` computes them (cs_t - cs_{t-w}, and cs_{w-1} for the first window)."""

    __slots__ = ("total", "past")

    def __init__(self):
        self.total = 0.0
        self.past: deque[float] = deque(maxlen=_KEEP)

    def add(self, x: float) -> None:
        self.total = self.total + x
        self.past.append(self.total)

    def window(self, w: int, n: int) -> float:
        """The sum of the last w values after n values were added (NaN before w of them)."""
        if n < w:
            return _NAN
        return self.total if n == w else self.total - self.past[-1 - w]


def _ratio(num: float, den: float, where_zero: float = 0.0) -> float:
    """fxray.data.features._ratio for scalars (NaN != 0, so NaN passes through)."""
    return num / den if den != 0 else where_zero


class FeatureStream:
    """The state of compute_features after each bar of one history (see the module doc)."""

    def __init__(self):
        self.n_bars = 0
        self.last_ts: int | None = None
        self.log_close: deque[float] = deque(maxlen=_KEEP)  # ln C_{t-60} .. ln C_t
        self.close: deque[float] = deque(maxlen=20)  # Bollinger's window
        self.high, self.low = deque(maxlen=60), deque(maxlen=60)  # Donchian's window
        self.high14, self.low14 = deque(maxlen=14), deque(maxlen=14)  # the stochastic's
        self.sums = {k: _Cumsum() for k in ("r2", "pk2", "c", "v", "signed_v", "typical_v", "events")}
        self.prev: tuple[float, float, float] | None = None  # previous (high, low, close)
        self.ema12 = self.ema26 = self.signal = 0.0
        self.cusum_up = self.cusum_down = 0.0  # S+ and -S- (both >= 0, as cusum_filter keeps them)
        # Wilder recursions (`_wilder`): RSI's average gain / loss, ATR, the sums of TR, +DM, -DM,
        # ADX; NaN until seeded (numpy's mean / sum of the first values, kept in `seeds`)
        wilders = ("gain", "loss", "atr", "tr", "plus", "minus", "adx")
        self.wilders = dict.fromkeys(wilders, _NAN)
        self.seeds: dict[str, list[float]] = {k: [] for k in wilders}

    @property
    def ready(self) -> bool:
        """True once the last bar's features are all past their lookback (t >= MAX_LOOKBACK)."""
        return self.n_bars > MAX_LOOKBACK

    def update(self, ts, open, high, low, close, volume=None) -> np.ndarray:  # noqa: A002
        """The features (42,) float32 of this bar, which must follow the previous one (StreamError,
        with no state changed, if it cannot). `ts`: int ns since epoch (UTC), the bar's close time;
        `volume`: None means 0."""
        ts = int(ts)
        o, h, l, c = float(open), float(high), float(low), float(close)
        v = 0.0 if volume is None else float(volume)
        if self.last_ts is not None and ts <= self.last_ts:
            raise StreamError(
                f"bar {self.n_bars}: ts {ts} is not after the previous bar's {self.last_ts}; "
                "feed bars in time order, one per close time"
            )
        for name, x in (("open", o), ("high", h), ("low", l), ("close", c)):
            if not (math.isfinite(x) and x > 0):
                raise StreamError(f"bar {self.n_bars} (ts {ts}): {name} = {x!r}; prices must be finite and > 0")
        if not (math.isfinite(v) and v >= 0):
            raise StreamError(f"bar {self.n_bars} (ts {ts}): volume = {v!r}; it must be finite and >= 0 (0: none)")
        t = self.n_bars
        f = [0.0] * N_FEATURES
        lc, lo, lh, ll = log(np.array((c, o, h, l))).tolist()
        prev_lc = self.log_close[-1] if t else lc
        self.log_close.append(lc)
        r = lc - prev_lc if t else 0.0  # r_0 = 0

        # --- returns, bar shape ---
        for k, j in _RETURNS:
            if t >= k:
                f[j] = lc - self.log_close[-1 - k]
        hl = lh - ll
        f[_INDEX["hl_range"]] = hl
        f[_INDEX["body"]] = lc - lo
        f[_INDEX["close_loc"]] = _ratio(c - l, h - l, 0.5) - 0.5
        f[_INDEX["gap"]] = lo - prev_lc

        # --- volatility ---
        sums, n = self.sums, t + 1
        sums["r2"].add(r * r)
        sums["pk2"].add(hl * hl / _PK)
        rv = {}
        for w, j_rv, j_pk in _VOL:
            rv[w] = math.sqrt(max(sums["r2"].window(w, n) / w, 0.0)) if n >= w else _NAN
            f[j_rv] = rv[w]
            f[j_pk] = math.sqrt(max(sums["pk2"].window(w, n) / w, 0.0)) if n >= w else _NAN
        both = rv[10] > 0 and rv[60] > 0  # False while either is NaN

        # --- trend, oscillators ---
        sums["c"].add(c)
        sma20, sma60 = sums["c"].window(20, n) / 20, sums["c"].window(60, n) / 60
        windows = ((self.high, self.low, 60, "donchian_60"), (self.high14, self.low14, 14, "stoch_k_14"))
        for highs, lows, w, name in windows:
            highs.append(h)
            lows.append(l)
            if n >= w:
                hh, lo_ = max(highs), min(lows)
                f[_INDEX[name]] = _ratio(c - lo_, hh - lo_, 0.5) - 0.5
        self._rsi(t, c, f)
        self._macd(t, c, f)
        self.close.append(c)
        if n >= 20:
            self._bollinger(c, sma20, f)

        # --- CUSUM events: h_t = CUSUM_H x rv_60, no events until rv_60 exists ---
        sigma = rv[60] if n >= 60 else 0.0
        thresh = CUSUM_H * sigma if sigma > 0 else math.inf
        up, down = max(self.cusum_up + r, 0.0), max(self.cusum_down - r, 0.0)
        fired_up, fired_down = up > thresh, down > thresh
        self.cusum_up, self.cusum_down = (0.0 if fired_up else up), (0.0 if fired_down else down)
        event = int(fired_up) - int(fired_down)
        finite = math.isfinite(thresh)
        f[_INDEX["cusum_event"]] = float(event)
        f[_INDEX["cusum_up"]] = self.cusum_up / thresh if finite else 0.0
        f[_INDEX["cusum_down"]] = -self.cusum_down / thresh if finite else 0.0
        sums["events"].add(float(abs(event)))
        f[_INDEX["cusum_rate_60"]] = sums["events"].window(60, n) / 60.0

        # --- volume (every value 0 where a window holds none, as in the batch) ---
        sign = 1.0 if c > o else (-1.0 if c < o else 0.0)  # np.sign(C - O)
        sums["v"].add(v)
        sums["signed_v"].add(sign * v)
        sums["typical_v"].add((h + l + c) / 3.0 * v)
        vsum60 = sums["v"].window(60, n)
        m60 = vsum60 / 60.0
        vol_ratio = _ratio(v + m60, 2.0 * m60, 1.0)
        f[_INDEX["vol_imb_20"]] = _ratio(sums["signed_v"].window(20, n), sums["v"].window(20, n))
        vwap = _ratio(sums["typical_v"].window(60, n), vsum60)

        # the second round of logs, in one numpy call (1.0 where a log is not taken)
        logs = log(
            np.array((sma20, sma60, _ratio(rv[10], rv[60], 1.0) if both else 1.0, vol_ratio, vwap if vwap > 0 else 1.0))
        ).tolist()
        f[_INDEX["ma_dev_20"]] = lc - logs[0]
        f[_INDEX["ma_dev_60"]] = lc - logs[1]
        f[_INDEX["rv_ratio"]] = logs[2] if both else 0.0
        f[_INDEX["vol_rel_60"]] = logs[3]
        f[_INDEX["vwap_dev_60"]] = lc - logs[4] if vwap > 0 else 0.0

        # --- calendar (UTC, from the bar close time): float32 phases, as the batch ---
        phases = np.array((ts % DAY_NS / DAY_NS * _TWO_PI, (ts + 3 * DAY_NS) % WEEK_NS / WEEK_NS * _TWO_PI), np.float32)
        sin, cos = np.sin(phases).tolist(), np.cos(phases).tolist()
        for j, x in zip(CALENDAR_INDICES, (sin[0], cos[0], sin[1], cos[1])):  # tod_sin, tod_cos, dow_sin, dow_cos
            f[j] = x

        self._directional(t, h, l, c, f)
        self.prev = (h, l, c)
        self.n_bars, self.last_ts = n, ts
        if t < MAX_LOOKBACK:  # warm-up: neutral
            for j, lookback in enumerate(LOOKBACKS):
                if t < lookback:
                    f[j] = 0.0
        total = sum(f)
        if total - total != 0:  # a NaN or inf somewhere (short windows): 0, as the batch's nan_to_num
            f = [x if math.isfinite(x) else 0.0 for x in f]
        return np.array(f, dtype=np.float32)

    # --- the recursions ------------------------------------------------------------------

    def _wilder(self, key: str, t: int, start: int, x: float, total: bool = False) -> float:
        """fxray.data.features.wilder, one value at a time: series `key` after x_t, seeded at
        t = start by numpy's mean (`total`: sum) of x over the last _N bars, NaN before."""
        if start - _N < t <= start:
            self.seeds[key].append(x)
        if t == start:
            seed = np.array(self.seeds[key])
            self.wilders[key] = float(np.sum(seed) if total else np.mean(seed))
        elif t > start:  # lfilter's first-order step: b0 x + y p
            self.wilders[key] = (1.0 if total else _B) * x + self.wilders[key] * _P
        return self.wilders[key]

    def _rsi(self, t: int, c: float, f: list) -> None:
        d = c - self.prev[2] if t else 0.0
        # Wilder averages seeded at t = 14 by the mean of the first 14 changes
        avg_gain, avg_loss = self._wilder("gain", t, _N, max(d, 0.0)), self._wilder("loss", t, _N, max(-d, 0.0))
        if t >= _N:
            rsi = 100.0 * _ratio(avg_gain, avg_gain + avg_loss, 0.5)
            f[_INDEX["rsi_14"]] = (rsi - 50.0) / 50.0

    def _macd(self, t: int, c: float, f: list) -> None:
        if t == 0:  # EMAs seeded at the first close; the signal at line_0 = 0 (as __init__ leaves it)
            self.ema12 = self.ema26 = c
        else:
            self.ema12 = _A12 * c + self.ema12 * (1.0 - _A12)
            self.ema26 = _A26 * c + self.ema26 * (1.0 - _A26)
        line = self.ema12 - self.ema26
        if t:
            self.signal = _A9 * line + self.signal * (1.0 - _A9)
        f[_INDEX["macd"]] = line / c
        f[_INDEX["macd_signal"]] = self.signal / c
        f[_INDEX["macd_hist"]] = (line - self.signal) / c

    def _bollinger(self, c: float, mid: float, f: list) -> None:
        acc = 0.0  # the batch's two-pass variance: (C - mid)^2 summed oldest lag first
        for x in self.close:
            d = x - mid
            acc = acc + d * d
        sd = math.sqrt(acc / 20)
        upper, lower = mid + 2.0 * sd, mid - 2.0 * sd
        width = upper - lower
        flat = width <= 1e-10 * abs(mid)
        f[_INDEX["bb_pctb_20"]] = (0.5 if flat else (c - lower) / width) - 0.5
        f[_INDEX["bb_width_20"]] = (upper - lower) / mid

    def _directional(self, t: int, h: float, l: float, c: float, f: list) -> None:
        """Wilder's +DI, -DI, ADX (sums seeded at t = 14, ADX at t = 27) and ATR (at t = 13)."""
        if t:
            ph, pl, pc = self.prev
            up, down = h - ph, -(l - pl)
            tr = max(h - l, max(abs(h - pc), abs(l - pc)))
        else:
            up, down, tr = 0.0, 0.0, h - l
        plus = up if (up > down and up > 0) else 0.0
        minus = down if (down > up and down > 0) else 0.0
        f[_INDEX["atr_14"]] = self._wilder("atr", t, _N - 1, tr) / c
        s_tr = self._wilder("tr", t, _N, tr, total=True)  # Wilder sums, seeded by the sum of x_1 .. x_14
        s_plus, s_minus = self._wilder("plus", t, _N, plus, total=True), self._wilder("minus", t, _N, minus, total=True)
        if t >= _N:
            plus_di, minus_di = 100.0 * _ratio(s_plus, s_tr), 100.0 * _ratio(s_minus, s_tr)
            dx = 100.0 * _ratio(abs(plus_di - minus_di), plus_di + minus_di)
            f[_INDEX["plus_di_14"]], f[_INDEX["minus_di_14"]] = plus_di, minus_di
            f[_INDEX["adx_14"]] = self._wilder("adx", t, 2 * _N - 1, dx)
