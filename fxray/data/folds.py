"""Walk-forward folds: half-open index ranges computed from bar timestamps alone.

Calendar windows, fold k (rolling; `anchored` keeps the train start at T0):

    train [T0 + k*step, T1)   val [T1, T2)   test [T2, T3)
    T1 = T0 + k*step + train,  T2 = T1 + val,  T3 = T2 + test

Each boundary becomes an index with `np.searchsorted(ts, T, "left")`; then the
first `embargo` bars of val and of test are dropped, so no feature window
(lookback L) nor 1-bar reward straddles a boundary: embargo >= L + 1.
A fold exists only if its test window is fully covered by the data
(T3 <= last close + one bar) and every segment keeps at least one bar.

Out of sample means out of sample: with step >= val + test (the default step is
val + test; a shorter one is refused), no fold's test window overlaps any fold's val
window, so no window that selected an epoch or a trial is reported as a test window,
and the test windows never overlap each other (they can be pooled).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

import numpy as np

_UNITS_NS = {"s": 10**9, "min": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}


class FoldError(ValueError):
    """Bad fold settings, or data too short for one fold; the message is one line."""


def parse_duration(text: str | int | float, key: str = "duration") -> int:
    """'30d', '12h', '90min', '2w', '10s' (or a number of days) -> nanoseconds."""
    if isinstance(text, numbers.Real) and not isinstance(text, (bool, np.bool_)):
        value, unit = float(text), "d"
        if not math.isfinite(value):
            raise FoldError(f"{key}: {text!r} is not a finite duration")
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(min|s|h|d|w)\s*", str(text))
        if not m:
            raise FoldError(f"{key}: {text!r} is not a duration; write e.g. '30d', '12h', '90min', '2w', '10s'")
        value, unit = float(m.group(1)), m.group(2)
    ns = int(round(value * _UNITS_NS[unit]))
    if ns <= 0:
        raise FoldError(f"{key}: {text!r} must be positive")
    return ns


@dataclass(frozen=True)
class FoldSpec:
    """Walk-forward settings; durations as strings like '20d' (calendar time)."""

    train: str = "20d"  # train window length
    val: str = "5d"  # validation window (epoch selection / early stopping)
    test: str = "5d"  # out-of-sample window, touched once per fold
    step: str | None = None  # shift between folds; None = val + test (the least that keeps them apart)
    anchored: bool = False  # True: train always starts at the first bar (expanding)
    embargo: int | None = None  # bars dropped at the start of val and test; None = lookback + 1
    max_folds: int | None = None  # keep only the first N folds
    # the last `holdout` of each train window, held out of training (an embargo before it), on
    # which a fold's epochs are chosen and stopped early; None = they are chosen on val, which
    # then scores the kept epoch that it chose (docs/metrics.md, "Where the epoch is chosen")
    holdout: str | None = None

    def validate(self) -> dict[str, int]:
        """FoldError (one line, naming the key) for a bad setting; else the durations in ns
        (train, val, test, holdout: 0 when none, step: val + test when none)."""
        ns = {key: parse_duration(getattr(self, key), f"folds.{key}") for key in ("train", "val", "test")}
        ns["holdout"] = 0 if self.holdout is None else parse_duration(self.holdout, "folds.holdout")
        if ns["holdout"] >= ns["train"]:
            raise FoldError(
                f"folds.holdout: {self.holdout!r} is not shorter than folds.train ({self.train}): it is "
                "carved from the end of the train window; shorten it or lengthen folds.train"
            )
        ns["step"] = ns["val"] + ns["test"] if self.step is None else parse_duration(self.step, "folds.step")
        if ns["step"] < ns["val"] + ns["test"]:
            raise FoldError(
                f"folds.step: {self.step!r} is shorter than val + test ({self.val} + {self.test}): fold k+1's "
                "val window would overlap fold k's test window, and a window the selection saw would be "
                "reported out of sample; use step >= val + test, or leave step out (it defaults to that)"
            )
        for key, unit in (("embargo", " (bars)"), ("max_folds", "")):
            value = getattr(self, key)  # an integer >= 1 (bool is an Integral: refused)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
                raise FoldError(f"folds.{key}: {value!r} must be an integer >= 1{unit}")
        return ns


@dataclass(frozen=True)
class Fold:
    """One walk-forward fold: half-open [start, end) bar index ranges. `holdout`, when the
    spec has one, lies between train and val: the epochs are chosen there, not on val."""

    k: int
    train: tuple[int, int]
    val: tuple[int, int]
    test: tuple[int, int]
    holdout: tuple[int, int] | None = None

    @property
    def chooser(self) -> tuple[int, int]:
        """The window on which the fold's epochs are chosen and stopped early."""
        return self.holdout if self.holdout is not None else self.val

    def as_dict(self) -> dict:
        d = {"k": self.k, "train": list(self.train), "val": list(self.val), "test": list(self.test)}
        if self.holdout is not None:
            d["holdout"] = list(self.holdout)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Fold:
        holdout = tuple(d["holdout"]) if d.get("holdout") is not None else None
        return cls(int(d["k"]), tuple(d["train"]), tuple(d["val"]), tuple(d["test"]), holdout)


def default_embargo() -> int:
    """The longest feature lookback + 1 bar of reward horizon."""
    from fxray.data.features import MAX_LOOKBACK

    return MAX_LOOKBACK + 1


def bar_spacing(ts: np.ndarray) -> int:
    """Typical bar spacing in ns (median of the gaps; weekends do not move it)."""
    if len(ts) < 2:
        return 1
    return int(np.median(np.diff(ts[: min(len(ts), 100_000)])))


def make_folds(ts: np.ndarray, spec: FoldSpec = FoldSpec()) -> list[Fold]:
    """Walk-forward folds over bar close times `ts`: int64 ns, strictly increasing, at least
    one bar (a Market's ts: cache.open checked it)."""
    train, val, test, holdout, step = spec.validate().values()
    embargo = spec.embargo if spec.embargo is not None else default_embargo()
    t0, covered = int(ts[0]), int(ts[-1]) + bar_spacing(ts)
    folds: list[Fold] = []
    k = 0
    while True:
        start = t0 if spec.anchored else t0 + k * step
        t1 = t0 + k * step + train
        t2, t3 = t1 + val, t1 + val + test
        if t3 > covered or (spec.max_folds is not None and len(folds) >= spec.max_folds):
            break
        a, b, d, f = np.searchsorted(ts, [start, t1, t2, t3], side="left").tolist()
        c, e = b + embargo, d + embargo
        # with a holdout, training ends at s, an embargo before the holdout window, which ends at t1
        s = int(np.searchsorted(ts, t1 - holdout, side="left")) if holdout else b
        held_out = (s + embargo, b) if holdout else None
        if a < s and (held_out is None or held_out[0] < held_out[1]) and c < d and e < f:
            folds.append(Fold(len(folds), (a, s), (c, d), (e, f), held_out))
        k += 1
    if not folds:
        days = (int(ts[-1]) - t0) / _UNITS_NS["d"]
        held = f" (its last {spec.holdout} held out to choose epochs)" if spec.holdout else ""
        raise FoldError(
            f"data too short for one fold: {len(ts):,} bars spanning {days:.2f} days; "
            f"folds need train {spec.train}{held} + val {spec.val} + test {spec.test} "
            f"(each with >= 1 bar after an embargo of {embargo} bars): "
            "shorten folds.train/val/test or give more data"
        )
    return folds
