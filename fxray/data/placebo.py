"""Placebo copies of a market: the same bars, features and order flow, but returns whose
direction nothing can predict.

    write_placebo(market, out, index=i, seed=s)    # an fxcache beside the sweep's run directory

How: every bar's return is sign-randomised around the mean bar return. For bar j (from
the close of bar j-1 to its own close) a fair coin s_j in {-1, +1}, drawn from
(seed, index) alone, keeps the bar (s = +1) or mirrors it around the previous close
(s = -1: the gap to its open, its body and its wicks all flip sign) and shifts its close
by twice the mean bar return mu, so that the new return is

    r'_j = mu + s_j (r_j - mu),    |r'_j - mu| = |r_j - mu|.

Opens, highs, lows and closes are rebuilt from the previous rebuilt close; the first bar
is kept as it is. The features and order-flow columns are NOT recomputed: they are the
original market's, computed from the original prices up to each bar's close, so they
still see no future (the coins of later bars are independent of everything before),
and they now carry no information on the direction of any later return:
E[r'_j - mu | anything known at bar j-1's close] = 0 exactly, whatever the features are.

Why signs and not a block permutation: flipping keeps each bar's size where it was, so
the volatility regimes, the intraday seasonality, the fat tails and the link between
the volatility features and the size of the next moves all survive (a learner can still
find "when to stay out"), and the drift survives too (mu), so a policy that only earns
the drift earns it in the placebos as well and is not mistaken for an edge. A block
permutation would keep the returns' own autocorrelation, but it moves the volatility
away from the features that describe it, and a block boundary leaks nothing the features
could use anyway: the features are computed from the original prices. What a placebo
removes is exactly the directional information the agent could learn.

The planted market's metadata (`synth`, `oracle`) is left out of the copy, so no oracle
is claimed there; the copy says what it is under `placebo` (method, seed, index, the
content hash of the original).
"""

from __future__ import annotations

import numpy as np

from fxray.data import cache
from fxray.data.libm import exp, log

METHOD = "sign-randomised around the mean bar return"
DROPPED_META = ("synth", "oracle")  # what a placebo must not claim: a planted signal and its oracle


def placebo_targets(targets: np.ndarray, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(targets', signs): OHLC (N, 4) float64 rebuilt from the sign-randomised returns, and
    the coins s (N,) int8 (s[0] = 1: the first bar is kept)."""
    o, h, l, c = (log(targets[:, i]) for i in range(4))
    prev = c[:-1]  # log close of bar j-1, for bars j = 1..N-1
    gap, body = o[1:] - prev, c[1:] - o[1:]
    wick_hi, wick_lo = h[1:] - prev, l[1:] - prev
    mu = float(np.mean(gap + body))
    rng = np.random.default_rng([int(seed), int(index)])
    s = np.where(rng.random(len(gap)) < 0.5, -1.0, 1.0)
    gap2 = s * gap
    body2 = s * body + (1.0 - s) * mu  # s = -1: -body + 2 mu, so r' = 2 mu - r
    hi2 = np.where(s > 0, wick_hi, -wick_lo)  # mirrored around the previous close: high <-> low
    lo2 = np.where(s > 0, wick_lo, -wick_hi)
    log_close = np.r_[c[0], c[0] + np.cumsum(gap2 + body2)]
    prev2 = log_close[:-1]
    out = np.empty_like(targets, dtype=np.float64)
    out[0] = targets[0]
    out[1:, 0] = exp(prev2 + gap2)
    out[1:, 3] = exp(log_close[1:])
    # the close moved by 2 mu: the wicks widen to contain the open and the close, as real bars do
    out[1:, 1] = np.maximum(exp(prev2 + hi2), np.maximum(out[1:, 0], out[1:, 3]))
    out[1:, 2] = np.minimum(exp(prev2 + lo2), np.minimum(out[1:, 0], out[1:, 3]))
    return out, np.concatenate(([1], s)).astype(np.int8)


def write_placebo(market: cache.Market, out, index: int, seed: int) -> str:
    """Write placebo `index` of `market` (an opened fxcache) at `out`; returns its content hash."""
    targets, _ = placebo_targets(np.asarray(market.targets), seed, index)
    meta = market.meta
    extra = {k: v for k, v in meta.items() if k not in cache.RESERVED_META and k not in DROPPED_META}
    extra["placebo"] = {
        "method": METHOD,
        "index": int(index),
        "seed": int(seed),
        "of": meta["content_hash"],
        "of_path": str(market.path),
    }
    names = {k: meta[k] for k in ("feature_names", "ofi_names", "instrument", "bar")}  # the original's
    source = f"{meta['source']} (placebo {index})"
    return cache.write(out, market.ts, market.features, market.ofi, targets, **names, source=source, extra_meta=extra)
