"""The embedded default market: seeded synthetic 1-minute bars with a planted signal.

What it models (all vectorised numpy, deterministic for a seed):
- a 24x5 session calendar (FX-like: Sunday 22:00 to Friday 22:00 UTC, weekend gaps);
- volatility = base x regime (a two-state Markov chain, ~1 day per regime) x an
  intraday seasonality (busier in the London/New York overlap);
- an order-flow imbalance `flow` s_t, a persistent AR(1) with unit variance, observed
  at bar t's close as ofi[:, 0]; three other order-flow columns are noisy relatives;
- the planted signal: the NEXT bar's log return is
      r[t] = ln(C[t+1]/C[t]) = beta * sigma[t+1] * s[t] + sigma[t+1] * eps[t+1],
  so s[t], known at t's close, predicts r[t] with correlation ~ beta.

`oracle_positions` is the position sequence of an agent that knows beta: long when
s > deadband, short when s < -deadband (deadband from the cost), flat otherwise.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

GENERATOR_VERSION = "1"
MINUTE_NS = 60 * 10**9
# Sunday 2020-01-05 22:00 UTC: the first session opens here.
EPOCH_START_NS = 1578261600 * 10**9
SYNTH_OFI_NAMES = (
    "flow_imbalance",
    "depth_imbalance",
    "trade_imbalance",
    "flow_intensity",
    "unused_4",
    "unused_5",
    "unused_6",
    "unused_7",
)


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of the synthetic market (defaults give a learnable but noisy market)."""

    n_bars: int = 200_000  # bars written (after the feature warm-up is dropped)
    seed: int = 0  # everything follows from it
    beta: float = 0.10  # predictive strength of flow: corr(s_t, r_t) ~ beta
    persistence: float = 0.95  # AR(1) coefficient of flow per bar (half-life ~ 13 bars)
    base_vol: float = 1e-4  # per-bar log-return volatility in the calm regime
    high_vol_mult: float = 2.0  # volatility multiplier of the turbulent regime
    regime_bars: int = 1440  # mean regime duration in bars
    price0: float = 1.10  # first price (EURUSD-like)


@dataclass(frozen=True)
class SynthMarket:
    """Simulated bars and the hidden quantities behind them (length N, aligned)."""

    ts: np.ndarray  # (N,) int64 ns bar close times
    open: np.ndarray  # (N,) float64
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray  # (N,) float64
    ofi: np.ndarray  # (N, 8) float32; column 0 is the planted flow s_t
    flow: np.ndarray  # (N,) float64 s_t
    sigma: np.ndarray  # (N,) float64 volatility of the bar's return
    spec: SynthSpec


def session_timestamps(n: int, start_ns: int = EPOCH_START_NS) -> np.ndarray:
    """First n minute-bar close times of a 24x5 calendar (closed Fri 22:00 - Sun 22:00 UTC)."""
    minutes_per_week = 7 * 1440
    weeks = n // (5 * 1440) + 2
    t = start_ns + MINUTE_NS * (1 + np.arange(weeks * minutes_per_week, dtype=np.int64))
    # minutes since the Sunday 22:00 open; the first 5 x 1440 minutes of each week trade
    since_open = ((t - start_ns - 1) // MINUTE_NS) % minutes_per_week
    return t[since_open < 5 * 1440][:n]


def _ar1(x: np.ndarray, phi: float) -> np.ndarray:
    from scipy.signal import lfilter

    return lfilter([1.0], [1.0, -phi], x)


def simulate(spec: SynthSpec, n_bars: int | None = None) -> SynthMarket:
    """Simulate `n_bars` (default spec.n_bars) bars; deterministic for spec.seed."""
    n = spec.n_bars if n_bars is None else n_bars
    rng = np.random.default_rng(spec.seed)
    ts = session_timestamps(n)

    # --- volatility: regime x intraday seasonality -------------------------------
    switch = rng.random(n) < 1.0 / spec.regime_bars
    regime = np.cumsum(switch) % 2  # 0 calm, 1 turbulent
    hour = (ts // (3600 * 10**9)) % 24
    seasonal = 0.8 + 0.6 * np.exp(-0.5 * ((hour - 14.5) / 3.0) ** 2)  # peak at 14:30 UTC
    sigma = spec.base_vol * np.where(regime == 1, spec.high_vol_mult, 1.0) * seasonal

    # --- order flow: AR(1) with unit stationary variance ---------------------------
    phi = spec.persistence
    flow = _ar1(rng.standard_normal(n) * np.sqrt(1 - phi**2), phi)
    flow[0] = rng.standard_normal()  # (lfilter starts at 0; close enough after the warm-up)

    # --- returns: bar t's return is predicted by flow at t-1 -----------------------
    eps = rng.standard_normal(n)
    ret = np.empty(n)
    ret[0] = sigma[0] * eps[0]
    ret[1:] = spec.beta * sigma[1:] * flow[:-1] + sigma[1:] * eps[1:]
    close = spec.price0 * np.exp(np.cumsum(ret))
    open_ = np.empty(n)
    open_[0] = spec.price0
    open_[1:] = close[:-1]
    wick = sigma * np.abs(rng.standard_normal((2, n))) * 0.6
    high = np.maximum(open_, close) * np.exp(wick[0])
    low = np.minimum(open_, close) * np.exp(-wick[1])
    volume = np.round(
        100 * seasonal * np.where(regime == 1, 1.8, 1.0) * rng.lognormal(0.0, 0.4, n) * (1 + 0.3 * np.abs(flow))
    )

    ofi = np.zeros((n, 8), np.float32)
    ofi[:, 0] = flow
    ofi[:, 1] = 0.5 * flow + np.sqrt(0.75) * rng.standard_normal(n)  # depth imbalance
    ofi[:, 2] = np.tanh(0.7 * flow + 0.5 * rng.standard_normal(n))  # trade imbalance in [-1,1]
    ofi[:, 3] = np.abs(flow) + 0.3 * rng.standard_normal(n)  # flow intensity
    return SynthMarket(ts, open_, high, low, close, volume, ofi, flow, sigma, spec)


def oracle_positions(flow: np.ndarray, beta: float, cost: float, sigma: float | np.ndarray) -> np.ndarray:
    """Positions in {-1, 0, +1} of an agent that knows the planted signal.

    Expected next-bar return is beta * sigma * s; holding a position earns it, and
    entering or flipping pays `cost` per unit. A deadband of cost / (beta * sigma)
    (one side of a round trip, amortised over the flow's persistence) keeps it from
    paying more in costs than it earns on weak signals.
    """
    edge = beta * np.asarray(sigma) * flow
    return np.where(edge > cost, 1, np.where(edge < -cost, -1, 0)).astype(np.int8)


def to_cache(spec: SynthSpec, out) -> str:
    """Simulate, compute the bar features, drop their warm-up and write an fxcache
    (through the same builder as real bars: `fxray.data.bars.build_cache`)."""
    from fxray.data.bars import build_cache
    from fxray.data.features import MAX_LOOKBACK

    m = simulate(spec, spec.n_bars + MAX_LOOKBACK)  # cache row i = simulated bar i + MAX_LOOKBACK
    return build_cache(
        m,
        out,
        instrument="SYNTH",
        source=f"fxray.synth v{GENERATOR_VERSION}",
        bar="1min",
        ofi=m.ofi,
        ofi_names=SYNTH_OFI_NAMES,
        extra_meta={"synth": asdict(spec)},
    )


def cache_dir() -> Path:
    return Path(os.environ.get("FXRAY_CACHE_DIR", Path.home() / ".cache" / "fxray"))


def default_path(spec: SynthSpec) -> Path:
    """Keyed by generator version, seed, size and a digest of everything else that shapes
    the file (the other parameters, the feature set, the format), so no stale file is reused."""
    import hashlib
    import json

    from fxray.data import cache
    from fxray.data.features import FEATURE_NAMES, MAX_LOOKBACK

    key = json.dumps([asdict(spec), FEATURE_NAMES, MAX_LOOKBACK, cache.FORMAT_VERSION], default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return cache_dir() / f"synth-v{GENERATOR_VERSION}-seed{spec.seed}-{spec.n_bars}-{digest}.fxcache"


def ensure_default(spec: SynthSpec = SynthSpec(), log=print) -> Path:
    """The default dataset: generated once, then reused (keyed by version, seed, size)."""
    path = default_path(spec)
    if not path.exists():
        log(f"generating the default synthetic market ({spec.n_bars:,} bars, seed {spec.seed}) -> {path}")
        to_cache(spec, path)
    return path
