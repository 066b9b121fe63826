"""The streaming policy: bars in, one position per bar out, the features kept incrementally.

    policy = Policy("policy/")                          # a bundle directory (or a loaded Bundle)
    pos = policy.on_bar(ts, open, high, low, close, volume)
    if pos is WARMING_UP: ...                           # the first MAX_LOOKBACK bars
    else: target = pos                                  # -1 short, 0 flat, +1 long

Per bar: fxray.data.stream.FeatureStream's update (exactly the batch features), the order
flow the policy reads (`ofi=`: required only for the columns bundle.ofi_read names; the
others are fed 0, as in training), the bundle's normalisation, each member's Q for the
position it holds (numpy, or the bundle's ONNX graphs with engine="onnxruntime"), then
p_t = argmax_a Q(s_t, p_{t-1}) - 1 from flat: the automaton fxray.eval.backtest.greedy_positions
runs over a window.

Warm-up is enforced: until MAX_LOOKBACK bars are behind it (every feature past its
lookback, as the fxcache builder drops them) `on_bar` returns WARMING_UP, a sentinel that
is not a position (it cannot be compared to a number, truth-tested or turned into an int).
The first position is that of the bar after the warm-up; started on the first bar of the
bars an fxcache was built from, the positions are those of the backtest of that cache
from its first row (tests/test_live.py).

What a position means: the target decided at bar t's close, to hold from the bundle's fill
(next_open: bar t+1's open; close: at once). The policy assumes the target was held; if the
engine could not fill it, set `policy.position` to what is held.
No torch here: numpy and safetensors (and onnxruntime for that engine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fxray.data.features import FEATURE_NAMES, MAX_LOOKBACK
from fxray.data.stream import FeatureStream, StreamError
from fxray.policy.bundle import Bundle, check_engine, check_features, load

ENGINES = ("numpy", "onnxruntime")


class _WarmingUp:
    """Not a position: the policy has not seen MAX_LOOKBACK bars yet (one instance, WARMING_UP)."""

    def __repr__(self) -> str:
        return "WARMING_UP"

    def __bool__(self):
        raise TypeError("WARMING_UP is not a position: test `pos is WARMING_UP` first")


WARMING_UP = _WarmingUp()


def bfloat16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32: what torch's
    .to(bfloat16).float() gives for finite values (the inputs of a bfloat16 training)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    u = (u + (((u >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


class _NumpyQ:
    """QNetwork's Q for one bar and one previous position, in numpy float32: the maths of
    fxray.rl.network.QNetwork.q_all's row for that position (Linear = x @ W.T + b; tests/test_live.py
    checks it equal to the network)."""

    def __init__(self, weights: dict):
        w = {k: np.asarray(v, np.float32) for k, v in weights.items()}
        self.w_in, self.b_in = np.ascontiguousarray(w["market_in.weight"].T), w["market_in.bias"]
        self.position_embed = w["position_embed"]  # (3, H): row p + 1
        layers = sorted({int(k.split(".")[1]) for k in w if k.startswith("body.")})
        self.body = [(np.ascontiguousarray(w[f"body.{i}.weight"].T), w[f"body.{i}.bias"]) for i in layers]
        self.w_head, self.b_head = np.ascontiguousarray(w["head.weight"].T), w["head.bias"]

    def __call__(self, market: np.ndarray, position: int) -> np.ndarray:
        h = market @ self.w_in + self.b_in + self.position_embed[position + 1]
        np.maximum(h, 0.0, out=h)
        for w, b in self.body:
            h = h @ w + b
            np.maximum(h, 0.0, out=h)
        out = h @ self.w_head + self.b_head
        value, adv = out[:1], out[1:]
        return value + adv - np.add.reduce(adv) / np.float32(3.0)  # adv.mean(), without its overhead


def _onnx_q(path):
    """The member's ONNX graph on one bar: (market, previous position) -> the row of that position."""
    from fxray.policy import onnx

    sess = onnx.session(path)
    return lambda market, position: onnx.run(sess, market[None])[0, position + 1]


class Policy:
    """A bundle's greedy policy fed one bar at a time (see the module doc)."""

    def __init__(self, bundle: Bundle | str, engine: str = "numpy"):
        self.bundle = bundle = bundle if isinstance(bundle, Bundle) else load(bundle)
        check_engine(engine, ENGINES)
        check_features(bundle, FEATURE_NAMES, f"{bundle.path}: this fxray's streaming features")
        self.members = [
            (m.mean, m.inv_std, _NumpyQ(m.weights) if engine == "numpy" else _onnx_q(m.onnx)) for m in bundle.members
        ]
        self.bfloat16 = bundle.input_dtype == "bfloat16"
        self.ofi_names = list(bundle.ofi_names)
        self.read_mask = np.isin(self.ofi_names, bundle.ofi_read)  # (8,) the order flow it reads; others fed 0
        self.features = FeatureStream()
        self.market = np.zeros(len(FEATURE_NAMES) + len(self.ofi_names), np.float32)  # (50,) a bar's raw inputs
        self.position = 0  # the position held: flat before the first decision
        self.q = np.full(3, np.nan, np.float32)  # the last bar's Q (3 actions) for the held position

    @property
    def warming_up(self) -> bool:
        return not self.features.ready

    @property
    def bars_to_go(self) -> int:
        """Bars still to feed before the first position."""
        return max(0, MAX_LOOKBACK + 1 - self.features.n_bars)

    def _ofi(self, ofi) -> np.ndarray:
        """(8,) float32: the columns the policy reads, 0 in the others (their value in training)."""
        n = len(self.ofi_names)
        if ofi is None:
            if self.bundle.ofi_read:
                raise StreamError(
                    f"ofi=None, but this policy reads order flow: pass {', '.join(self.bundle.ofi_read)} "
                    f"(a dict by name, or {n} values in policy.ofi_names order)"
                )
            return np.zeros(n, np.float32)
        if isinstance(ofi, Mapping):
            unknown = sorted(set(ofi) - set(self.ofi_names))
            lacks = [name for name in self.bundle.ofi_read if name not in ofi]
            faults = [f"{', '.join(unknown)} not among {', '.join(self.ofi_names)}"] if unknown else []
            faults += [f"lacks {', '.join(lacks)}, which this policy reads"] if lacks else []
            if faults:
                raise StreamError(f"ofi keys {sorted(ofi)}: " + "; ".join(faults))
            ofi = [ofi.get(name, 0.0) for name in self.ofi_names]
        values = np.asarray(ofi if isinstance(ofi, Sequence | np.ndarray) else [ofi], np.float64)
        if values.shape != (n,) or not np.isfinite(values).all():
            raise StreamError(f"ofi must be {n} finite values ({', '.join(self.ofi_names)}), got {ofi!r}")
        return np.where(self.read_mask, values, 0.0).astype(np.float32)

    def on_bar(self, ts, open, high, low, close, volume=None, ofi=None):  # noqa: A002
        """The position (-1, 0, +1) decided at this bar's close, or WARMING_UP.
        `ts`: int ns since epoch (UTC), the bar's close time, after the previous bar's.
        Raises StreamError (one line; the state is unchanged) for a bar it cannot take."""
        ofi_values = self._ofi(ofi)  # checked before the stream moves on
        self.market[: len(FEATURE_NAMES)] = self.features.update(to_ns(ts), open, high, low, close, volume)
        self.market[len(FEATURE_NAMES) :] = ofi_values
        if not self.features.ready:
            return WARMING_UP
        raw = bfloat16_round(self.market) if self.bfloat16 else self.market
        qs = [q((raw - mean) * inv_std, self.position) for mean, inv_std, q in self.members]
        self.q = qs[0] if len(qs) == 1 else np.mean(np.stack(qs), axis=0)
        # np.argmax: the first maximum (and a NaN wins), as torch.argmax in the backtest
        self.position = int(np.argmax(self.q)) - 1
        return self.position


def to_ns(ts) -> int:
    """A bar time as int ns since epoch, UTC: an int, numpy datetime64 / int64, or an aware datetime."""
    import datetime as dt

    if isinstance(ts, dt.datetime):
        if ts.tzinfo is None:
            raise StreamError(f"ts {ts!r} has no time zone: give UTC (e.g. datetime(..., tzinfo=timezone.utc))")
        return (ts - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000
    if isinstance(ts, np.datetime64):
        return int(ts.astype("datetime64[ns]").astype(np.int64))
    if isinstance(ts, float | np.floating) or not isinstance(ts, int | np.integer):
        raise StreamError(f"ts {ts!r}: give int ns since epoch (UTC), a numpy datetime64 or an aware datetime")
    return int(ts)
