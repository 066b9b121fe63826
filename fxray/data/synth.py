"""The embedded default market: seeded synthetic 1-minute bars with a planted signal of
realistic strength, its oracle, and a shuffled twin with no signal at all.

What it models (all vectorised numpy, deterministic for a seed):
- a 24x5 session calendar (FX-like: Sunday 22:00 to Friday 22:00 UTC, weekend gaps);
- volatility = base x regime (a two-state Markov chain, ~1 day per regime) x an
  intraday seasonality (busier in the London/New York overlap);
- a latent signal z_t, a persistent AR(1) with unit variance, never observed itself;
- two noisy views of it, known at bar t's close: the order-flow imbalance of the last
  ~ofi_span bars (ofi[:, 0]: an exponential average of each bar's flow, z + noise;
  three other order-flow columns are noisier views of the bar's own flow), and the
  close location of the bar (bars close near their high when z is high: the wicks lean);
- the planted signal: the NEXT bar's log return is
      r[t] = ln(C[t+1]/C[t]) = beta * g[t] * sigma[t+1] * z[t] + sigma[t+1] * eps[t+1]
  with g = 1 (structure "flow"), or g = 1 only in the hours `session_hours` UTC and 0
  otherwise (structure "session": an edge that switches off outside the London/New
  York overlap, which a linear rule on the inputs cannot express).
- the nonlinear family (structures "interaction", "regime", "threshold", "hold"): z drives
  nothing (its views stay, as inputs that say nothing); the next bar's return is
      r[t] = beta * sigma[t+1] * f[t] + sigma[t+1] * eps[t+1]
  with f a nonlinear function of inputs written, observed, into ofi columns 4-7 (named
  planted_*), so that a linear rule on the inputs earns ~0 and a rule told the function
  earns (`planted`, tests/test_synth_nonlinear.py): a product of two persistent inputs; a
  view whose sign flips with an observed +-1 regime; a threshold of |input| (long when it is
  large, short when small: an even function, with no linear part); an event that sets the
  drift for HOLD_BARS bars and is seen only on the bar it happens (a rule must hold through
  the noise after it). Their oracle is fxray.eval.baselines' rule on f's form
  (`oracle_meta`'s "form").
- `shuffle`: the twin: each bar's return mirrored around the mean bar return by a fair
  coin (r' = mu + s (r - mu), as fxray.data.placebo does), so nothing predicts its
  direction and each bar's size stays where it was; the views and features are computed as
  usual (from the new prices).

The defaults are sized so that the oracle rule (fxray.eval.baselines on the planted
columns, fitted on a fold's train slice, at a realistic 0.4 bp cost) earns a pooled
out-of-sample Sharpe of a few units, as real edges do, not tens: docs/metrics.md.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fxray.data.libm import exp

GENERATOR_VERSION = "3"  # 3: the twin by sign coins, not a permutation within days
MINUTE_NS = 60 * 10**9
# Sunday 2020-01-05 22:00 UTC: the first session opens here.
EPOCH_START_NS = 1578261600 * 10**9
SYNTH_OFI_NAMES = ("flow_imbalance", "depth_imbalance", "trade_imbalance", "flow_intensity")  # ofi columns 0-3


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of the synthetic market (defaults give a learnable but noisy market)."""

    n_bars: int = 200_000  # bars written (after the feature warm-up is dropped)
    seed: int = 0  # everything follows from it
    structure: str = "flow"  # "flow" (always on), "session" (on in session_hours), or a nonlinear one
    # (NONLINEAR: "interaction", "regime", "threshold", "hold"; beta then scales their edge)
    beta: float = 0.025  # predictive strength of z: corr(z_t, r_t) ~ beta
    persistence: float = 0.98  # AR(1) coefficient of z per bar (half-life ~ 34 bars)
    ofi_noise: float = 2.0  # std of the noise in each bar's order flow (z has std 1)
    ofi_span: int = 10  # bars: ofi[:, 0] is the exponential average of the bars' order flow
    clv_noise: float = 1.0  # std of the noise in the close-location view
    clv_strength: float = 0.6  # how far the wicks lean with the close-location view
    session_hours: tuple = (12, 16)  # [start, end) hours UTC of the "session" structure's edge
    shuffle: bool = False  # the twin with no signal: each return's sign a coin around the mean
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
    ofi: np.ndarray  # (N, 8) float32; column 0 is the order-flow view of z
    flow: np.ndarray  # (N,) float64 z_t, the latent signal
    sigma: np.ndarray  # (N,) float64 volatility of the bar's return
    gate: np.ndarray  # (N,) float64 g_t: 1 where z_t drives r_t, else 0
    edge: np.ndarray | None = None  # (N,) float64 f_t of a nonlinear market (None: z drives r)


def session_timestamps(n: int, start_ns: int = EPOCH_START_NS) -> np.ndarray:
    """First n minute-bar close times of a 24x5 calendar (closed Fri 22:00 - Sun 22:00 UTC)."""
    minutes_per_week = 7 * 1440
    weeks = n // (5 * 1440) + 2
    minute = np.arange(weeks * minutes_per_week, dtype=np.int64)  # minutes since the first Sunday 22:00 open
    t = start_ns + MINUTE_NS * (1 + minute)  # each bar closes at the end of its minute
    return t[minute % minutes_per_week < 5 * 1440][:n]  # the first 5 x 1440 minutes of each week trade


def _ar1(x: np.ndarray, phi: float) -> np.ndarray:
    from scipy.signal import lfilter

    return lfilter([1.0], [1.0, -phi], x)


def simulate(spec: SynthSpec, n_bars: int | None = None) -> SynthMarket:
    """Simulate `n_bars` (default spec.n_bars) bars; deterministic for spec.seed."""
    if spec.structure not in STRUCTURES:
        raise ValueError(f"data.synth.structure: {spec.structure!r} must be one of {', '.join(STRUCTURES)}")
    n = spec.n_bars if n_bars is None else n_bars
    rng = np.random.default_rng(spec.seed)
    ts = session_timestamps(n)

    # --- volatility: regime x intraday seasonality -------------------------------
    switch = rng.random(n) < 1.0 / spec.regime_bars
    regime = np.cumsum(switch) % 2  # 0 calm, 1 turbulent
    hour = (ts // (3600 * 10**9)) % 24
    seasonal = 0.8 + 0.6 * exp(-0.5 * ((hour - 14.5) / 3.0) ** 2)  # peak at 14:30 UTC
    sigma = spec.base_vol * np.where(regime == 1, spec.high_vol_mult, 1.0) * seasonal

    # --- the latent signal: AR(1) with unit stationary variance --------------------
    phi = spec.persistence
    z = _ar1(rng.standard_normal(n) * np.sqrt(1 - phi**2), phi)
    z[0] = rng.standard_normal()  # (lfilter starts at 0; close enough after the warm-up)
    if spec.structure in NONLINEAR:  # its own stream: the default market's draws stay as they were
        edge, planted_cols = planted(spec, n)
        gate, drive = np.zeros(n), edge
    else:
        start, end = spec.session_hours  # "session": on for bars whose close hour (UTC) is in [start, end)
        gate = np.ones(n) if spec.structure == "flow" else ((hour >= start) & (hour < end)).astype(np.float64)
        edge, drive = None, gate * z  # z where the gate is on (g is 0 or 1: exactly z or 0)

    # --- returns: bar t's return is predicted by z at t-1 (where the gate is on), or by f at t-1 ---
    ret = sigma * rng.standard_normal(n)  # the noise; the edge is added onto it (+ is exact either way round)
    ret[1:] += spec.beta * sigma[1:] * drive[:-1]
    if spec.shuffle:  # the twin: every return's sign a coin around the mean (as fxray.data.placebo)
        # (a permutation within each day, the twin of generator v2, kept each day's drift, and
        # the day's order flow told it: day-level corr 0.40 on the CPU market; docs/metrics.md)
        mu = ret.mean()
        ret = mu + np.where(rng.random(n) < 0.5, -1.0, 1.0) * (ret - mu)
    close = spec.price0 * exp(np.cumsum(ret))
    open_ = np.r_[spec.price0, close[:-1]]
    # the wicks lean with the close-location view: a high view shortens the upper wick
    clv_view = z + spec.clv_noise * rng.standard_normal(n)
    lean = exp(spec.clv_strength * np.clip(clv_view, -3, 3))
    wick = sigma * np.abs(rng.standard_normal((2, n))) * 0.6
    high = np.maximum(open_, close) * exp(wick[0] / lean)
    low = np.minimum(open_, close) * exp(-wick[1] * lean)
    volume = np.round(
        100 * seasonal * np.where(regime == 1, 1.8, 1.0) * rng.lognormal(0.0, 0.4, n) * (1 + 0.3 * np.abs(z))
    )

    bar_flow = z + spec.ofi_noise * rng.standard_normal(n)  # each bar's own order flow: noisy
    alpha = 2.0 / (spec.ofi_span + 1)  # the flow imbalance over the last bars: a causal EMA
    view = _ar1(alpha * bar_flow, 1.0 - alpha)
    view /= view.std()
    ofi = np.zeros((n, 8), np.float32)
    ofi[:, 0] = view
    ofi[:, 1] = 0.5 * bar_flow + rng.standard_normal(n)  # depth imbalance: this bar's, noisier
    ofi[:, 2] = np.tanh(0.3 * bar_flow + 0.5 * rng.standard_normal(n))  # trade imbalance in [-1,1]
    ofi[:, 3] = np.abs(bar_flow) + 0.3 * rng.standard_normal(n)  # flow intensity
    if edge is not None:
        ofi[:, 4 : 4 + planted_cols.shape[1]] = planted_cols
    return SynthMarket(ts, open_, high, low, close, volume, ofi, z, sigma, gate, edge)


# --- the nonlinear family: f_t from observed inputs -------------------------------------------------

NONLINEAR = ("interaction", "regime", "threshold", "hold")
PLANTED_OFI = {  # the inputs each writes into ofi columns 4.. (known at the bar's close)
    "interaction": ("planted_a", "planted_b"),
    "regime": ("planted_view", "planted_regime"),
    "threshold": ("planted_level",),
    "hold": ("planted_event",),
}
REGIME_BARS = 720  # "regime": mean bars between flips of the observed +-1 regime
THRESHOLD = 1.0  # "threshold": |u| beyond it is long, within it short
THRESHOLD_P = 0.31731050786291415  # P(|N(0, 1)| > 1): f has mean 0
THRESHOLD_SPAN = 60  # "threshold": u is an exponential average (bars) of an AR(1), unit variance
EVENT_BARS = 240  # "hold": mean bars between events
HOLD_BARS = 120  # "hold": bars an event's drift lasts
EVENT_SIZE, EVENT_NOISE = 3.0, 0.3  # "hold": the event column, s * size on the event's bar, + noise
EVENT_SEEN = 4.0  # "hold": |normalised event column| above it is an event (noise ~0.8, events ~8)


def planted(spec: SynthSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(f (n,), the observed inputs (n, k)) of a nonlinear market, from a stream of its own
    (seed, structure). Persistent inputs are AR(1) with unit variance and spec.persistence."""
    rng = np.random.default_rng([spec.seed, 53, NONLINEAR.index(spec.structure)])
    phi = spec.persistence

    def ar1():
        return _ar1(rng.standard_normal(n) * np.sqrt(1 - phi**2), phi)

    if spec.structure == "interaction":  # E[r | a] = E[r | b] = 0: only the product says anything
        a, b = ar1(), ar1()
        return a * b, np.stack((a, b), axis=1)
    if spec.structure == "regime":  # the view's sign flips with the regime: over regimes it averages out
        view = ar1()
        flips = np.cumsum(rng.random(n) < 1.0 / REGIME_BARS)
        regime = np.where(flips % 2 == 0, 1.0, -1.0) * rng.choice((-1.0, 1.0))
        return view * regime, np.stack((view, regime), axis=1)
    if spec.structure == "threshold":  # an even function of u: no linear part
        alpha = 2.0 / (THRESHOLD_SPAN + 1)  # smoothed: a level a path crosses less often than costs allow
        u = _ar1(alpha * ar1(), 1.0 - alpha)
        u /= u.std()
        f = ((np.abs(u) > THRESHOLD) - THRESHOLD_P) / np.sqrt(THRESHOLD_P * (1 - THRESHOLD_P))
        return f, u[:, None]
    # "hold": an event's sign sets the drift for HOLD_BARS bars; the input shows it on one bar
    events = rng.random(n) < 1.0 / EVENT_BARS
    signs = rng.choice((-1.0, 1.0), n)
    t = np.arange(n)
    last = np.maximum.accumulate(np.where(events, t, -1))
    f = np.where((last >= 0) & (t - last < HOLD_BARS), signs[np.maximum(last, 0)], 0.0)
    return f, (EVENT_SIZE * signs * events + EVENT_NOISE * rng.standard_normal(n))[:, None]


# the form of f for fxray.eval.baselines (FORMS): [name, *parameters] (the linear structures'
# oracle is the rule on the views' columns)
ORACLE_FORMS = {
    "interaction": ["product"],
    "regime": ["signed"],
    "threshold": ["threshold", THRESHOLD, THRESHOLD_P],
    "hold": ["hold", EVENT_SEEN, HOLD_BARS],
}


def ofi_names(spec: SynthSpec) -> tuple:
    """The views of z, then the planted inputs of a nonlinear market, then unused_j up to 8."""
    names = SYNTH_OFI_NAMES + PLANTED_OFI.get(spec.structure, ())
    return names + tuple(f"unused_{j}" for j in range(len(names), 8))


STRUCTURES = ("flow", "session", *NONLINEAR)
ORACLE_INPUTS = ("ofi:flow_imbalance", "features:close_loc")  # where the views of z live


def oracle_meta(spec: SynthSpec) -> dict | None:
    """What fxray.eval.baselines' oracle needs to know of a market: the columns of the views
    and the hours of the edge (None for the shuffled twin: it has no edge to know)."""
    if spec.shuffle:
        return None
    if spec.structure in NONLINEAR:
        inputs = [f"ofi:{name}" for name in PLANTED_OFI[spec.structure]]
        return {"inputs": inputs, "hours": None, "form": ORACLE_FORMS[spec.structure]}
    hours = list(spec.session_hours) if spec.structure == "session" else None
    return {"inputs": list(ORACLE_INPUTS), "hours": hours}


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
        ofi=m.ofi,
        ofi_names=ofi_names(spec),
        extra_meta={"synth": asdict(spec), "oracle": oracle_meta(spec)},
    )


def default_path(spec: SynthSpec) -> Path:
    """Keyed by generator version, seed, size and a digest of everything else that shapes
    the file (the other parameters, the feature set, the format), so no stale file is reused."""
    import hashlib
    import json

    from fxray.data import cache
    from fxray.data.features import FEATURE_NAMES, MAX_LOOKBACK

    # "libm": exp and log the C library's on every CPU (a file made before, on an AVX-512 CPU, differs)
    key = json.dumps([asdict(spec), FEATURE_NAMES, MAX_LOOKBACK, cache.FORMAT_VERSION, "libm"], default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    cache_dir = Path(os.environ.get("FXRAY_CACHE_DIR", Path.home() / ".cache" / "fxray"))
    return cache_dir / f"synth-v{GENERATOR_VERSION}-seed{spec.seed}-{spec.n_bars}-{digest}.fxcache"


def ensure_default(spec: SynthSpec = SynthSpec(), log=print) -> Path:
    """The default dataset: generated once, then reused (keyed by version, seed, size)."""
    path = default_path(spec)
    if not path.exists():
        log(f"generating the default synthetic market ({spec.n_bars:,} bars, seed {spec.seed}) -> {path}")
        to_cache(spec, path)
    return path


def oracle_columns(meta: dict, n_features: int):
    """(input columns of features ++ ofi, hours or None, form or None) of a cache's oracle,
    from its metadata; None when the data carries no oracle (real data, the shuffled twin).
    A nonlinear market's oracle is a rule on its form (fxray.eval.baselines.FORMS), never
    the linear rule on its columns alone."""
    oracle = meta.get("oracle")
    if not oracle:
        return None
    names = {"features": meta["feature_names"], "ofi": meta["ofi_names"]}
    inputs = [item.partition(":") for item in oracle["inputs"]]
    cols = [names[kind].index(name) + (n_features if kind == "ofi" else 0) for kind, _, name in inputs]
    return cols, oracle.get("hours"), oracle.get("form")
