"""fxray.data.stream: the streaming features equal the batch features exactly (==, every
element of every row) on real shared bars and on random ones, short histories included;
a bar the stream cannot take is refused with one line and leaves its state unchanged."""

import numpy as np
import pytest
from conftest import SHARED_DATA
from test_features import random_bars

from fxray.data.bars import load_bars
from fxray.data.features import FEATURE_NAMES, MAX_LOOKBACK, compute_features
from fxray.data.stream import FeatureStream, StreamError

EURUSD = SHARED_DATA / "bars/eurusd_m1_2017q1/DAT_ASCII_EURUSD_M1_201701.csv"
SIXE = SHARED_DATA / "bars/6EH4.XCME_1min_bars_20240101_20240131.csv.gz"


def streamed(ts, o, h, l, c, v=None) -> np.ndarray:
    s = FeatureStream()
    vol = np.zeros(len(ts)) if v is None else v
    rows = [s.update(ts[i], o[i], h[i], l[i], c[i], vol[i]) for i in range(len(ts))]
    return np.stack(rows) if rows else np.zeros((0, len(FEATURE_NAMES)), np.float32)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    bad = np.flatnonzero((got != want).any(axis=0))
    assert not len(bad), {FEATURE_NAMES[j]: int((got[:, j] != want[:, j]).sum()) for j in bad}


@pytest.mark.parametrize(
    "path, tz", [(EURUSD, "Etc/GMT+5"), (SIXE, None)], ids=["eurusd_histdata_no_volume", "cme_6e_with_volume"]
)
def test_stream_equals_batch_bit_for_bit_on_real_bars(path, tz):
    if not path.exists():
        pytest.skip(f"{path} not available")
    bars = load_bars(path, tz=tz)
    assert len(bars) > 25_000 and (tz is not None) == (bars.volume is None)
    want = compute_features(bars.ts, bars.open, bars.high, bars.low, bars.close, bars.volume)
    assert_same(streamed(bars.ts, bars.open, bars.high, bars.low, bars.close, bars.volume), want)


@pytest.mark.parametrize("n", [1, 13, 15, 28, 59, 61, 119, 121, 3000])
def test_stream_equals_batch_on_random_bars_of_any_length(n):
    ts, o, h, l, c, v = random_bars(n, seed=n)
    assert_same(streamed(ts, o, h, l, c, v), compute_features(ts, o, h, l, c, v))


def test_flat_prices_and_bursts_of_volume():
    """Edge paths: H = L bars (no range), unchanged closes (RSI 0/0, no DM), a Bollinger band
    of no width, volume that starts late and stops (windows of zero volume)."""
    ts, o, h, l, c, v = random_bars(800, seed=3)
    c[100:300] = o[100:300] = h[100:300] = l[100:300] = 1.25
    v[:400] = 0.0
    v[600:] = 0.0
    assert_same(streamed(ts, o, h, l, c, v), compute_features(ts, o, h, l, c, v))


def test_ready_after_the_longest_lookback():
    ts, o, h, l, c, v = random_bars(MAX_LOOKBACK + 2, seed=1)
    s = FeatureStream()
    readiness = [(s.update(ts[i], o[i], h[i], l[i], c[i], v[i]), s.ready)[1] for i in range(len(ts))]
    assert readiness.index(True) == MAX_LOOKBACK and all(readiness[MAX_LOOKBACK:])


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(ts=-1), "is not after the previous bar's"),
        (dict(ts=0), "is not after the previous bar's"),
        (dict(close=float("nan")), "close = nan; prices must be finite and > 0"),
        (dict(high=float("inf")), "high = inf"),
        (dict(low=-1.0), "low = -1.0"),
        (dict(volume=float("nan")), "volume = nan"),
        (dict(volume=-5.0), "volume = -5.0"),
    ],
)
def test_a_bad_bar_is_one_line_and_changes_nothing(change, needle):
    ts, o, h, l, c, v = random_bars(200, seed=2)
    s = FeatureStream()
    for i in range(150):
        s.update(ts[i], o[i], h[i], l[i], c[i], v[i])
    bar = dict(ts=ts[150], open=o[150], high=h[150], low=l[150], close=c[150], volume=v[150])
    if "ts" in change:
        change = {"ts": ts[149] + change["ts"]}
    with pytest.raises(StreamError) as e:
        s.update(**{**bar, **change})
    assert needle in str(e.value) and "\n" not in str(e.value)
    for i in range(150, 200):  # the refused bar left no trace: the rest still matches the batch
        row = s.update(ts[i], o[i], h[i], l[i], c[i], v[i])
    assert_same(row[None], compute_features(ts, o, h, l, c, v)[-1:])
