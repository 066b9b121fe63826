"""Walk-forward folds: `make_folds` equals a brute-force reference on many random
timestamp sets and specs; every fold keeps its invariants and the embargo; bad
settings and too-short data get a one-line FoldError naming the key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fxray.data import folds
from fxray.data.folds import Fold, FoldError, FoldSpec, make_folds, parse_duration

MIN_NS = 60 * 10**9
DAY_NS = 1440 * MIN_NS
T0 = 1_704_067_200 * 10**9  # 2024-01-01 00:00 UTC, a Monday


def max_lookback() -> int:
    """features.MAX_LOOKBACK (features.py is written elsewhere; import lazily)."""
    from fxray.data.features import MAX_LOOKBACK

    return MAX_LOOKBACK


# --- the reference: plain loops, comparisons only --------------------------------------


def reference_folds(ts, train, val, test, step, anchored, embargo, max_folds, holdout=0):
    """Walk the calendar windows one by one; a bar is in a window iff lo <= ts < hi.

    Durations in ns. The data covers up to the last close + the typical bar spacing
    (median gap; the tests stay below the 100k bars `bar_spacing` looks at). With a
    `holdout` duration the last `holdout` of the train window is the holdout window, whose
    first `embargo` bars are dropped, as val's and test's are."""
    ts = [int(t) for t in ts]
    gaps = sorted(ts[i + 1] - ts[i] for i in range(len(ts) - 1))
    if not gaps:
        spacing = 1
    elif len(gaps) % 2:
        spacing = gaps[len(gaps) // 2]
    else:
        spacing = (gaps[len(gaps) // 2 - 1] + gaps[len(gaps) // 2]) // 2
    covered = ts[-1] + spacing
    result = []
    k = 0
    while max_folds is None or len(result) < max_folds:
        train_start = ts[0] if anchored else ts[0] + k * step
        val_start = ts[0] + k * step + train
        test_start = val_start + val
        test_end = test_start + test
        if test_end > covered:
            break
        train_bars, holdout_bars, val_bars, test_bars = [], [], [], []
        for i, t in enumerate(ts):
            if train_start <= t < val_start - holdout:
                train_bars.append(i)
            elif val_start - holdout <= t < val_start and train_start <= t:
                holdout_bars.append(i)
            elif val_start <= t < test_start:
                val_bars.append(i)
            elif test_start <= t < test_end:
                test_bars.append(i)
        val_bars, test_bars = val_bars[embargo:], test_bars[embargo:]  # the embargo drops bars
        holdout_bars = holdout_bars[embargo:]
        if train_bars and val_bars and test_bars and (holdout_bars or not holdout):
            result.append(
                Fold(
                    len(result),
                    (train_bars[0], train_bars[-1] + 1),
                    (val_bars[0], val_bars[-1] + 1),
                    (test_bars[0], test_bars[-1] + 1),
                    (holdout_bars[0], holdout_bars[-1] + 1) if holdout else None,
                )
            )
        k += 1
    return result


# --- random cases ------------------------------------------------------------------------


def random_ts(rng) -> np.ndarray:
    """Strictly increasing bar closes: a base spacing, random gaps, weekend-like holes."""
    spacing = int(rng.choice([MIN_NS, 5 * MIN_NS, 60 * MIN_NS, DAY_NS]))
    n = int(rng.integers(1, 1200))
    kind = rng.integers(4)
    if kind == 0:  # a regular grid
        gaps = np.full(n, spacing)
    elif kind == 1:  # mostly regular, some missing bars
        gaps = spacing * rng.geometric(0.7, n)
    else:  # jittered gaps, not on any grid
        gaps = rng.integers(spacing // 2, 2 * spacing, n)
    ts = T0 + int(rng.integers(0, DAY_NS)) + np.cumsum(gaps)
    if kind >= 2 and n > 2:  # weekend-like holes: drop every bar in [Sat, Mon) of each week
        week_pos = (ts - T0) % (7 * DAY_NS)
        keep = week_pos < 5 * DAY_NS
        if keep.any():
            ts = ts[keep]
    if kind == 3 and len(ts) > 3:  # one long outage
        i = int(rng.integers(1, len(ts)))
        ts[i:] += int(rng.integers(1, 20)) * DAY_NS
    return ts.astype(np.int64)


def as_text(minutes: int, rng):
    """An exact spelling of a duration, varying the unit and form."""
    options = [f"{minutes}min"]
    if minutes % 60 == 0:
        options.append(f"{minutes // 60}h")
    if minutes % 1440 == 0:
        options += [f"{minutes // 1440}d", minutes // 1440]
    if minutes % 720 == 0:
        options.append(minutes / 1440)  # 0.5-day multiples are exact floats
    if minutes % (7 * 1440) == 0:
        options.append(f"{minutes // (7 * 1440)}w")
    return options[int(rng.integers(len(options)))]


def random_spec(rng, ts) -> tuple[FoldSpec, dict]:
    """A spec scaled to the span of `ts`, and its numbers in ns for the reference."""
    span_min = max((int(ts[-1]) - int(ts[0])) // MIN_NS, 10)
    grain = int(rng.choice([1, 60, 720, 1440]))  # so the spellings cover min/h/d/w

    def minutes(lo, hi):
        m = int(rng.uniform(lo, hi) * span_min)
        return max(grain, m // grain * grain)

    train, val, test = minutes(0.05, 0.5), minutes(0.005, 0.1), minutes(0.005, 0.1)
    # the step keeps every fold's test window clear of every val window: >= val + test
    step = None if rng.random() < 0.3 else val + test + minutes(0.0, 0.1) * int(rng.random() < 0.7)
    embargo = None if rng.random() < 0.2 else int(rng.choice([1, 2, 3, 7, 25]))
    max_folds = None if rng.random() < 0.6 else int(rng.integers(1, 6))
    anchored = bool(rng.random() < 0.4)
    # drawn last, so the other settings are those of the cases before holdout existed
    holdout = minutes(0.005, 0.1) if rng.random() < 0.4 else 0
    if holdout >= train:
        holdout = 0
    spec = FoldSpec(
        train=as_text(train, rng),
        val=as_text(val, rng),
        test=as_text(test, rng),
        step=None if step is None else as_text(step, rng),
        anchored=anchored,
        embargo=embargo,
        max_folds=max_folds,
        holdout=as_text(holdout, rng) if holdout else None,
    )
    ref = dict(
        train=train * MIN_NS,
        val=val * MIN_NS,
        test=test * MIN_NS,
        step=(val + test if step is None else step) * MIN_NS,
        anchored=anchored,
        embargo=max_lookback() + 1 if embargo is None else embargo,
        max_folds=max_folds,
        holdout=holdout * MIN_NS,
    )
    return spec, ref


def random_cases(count=300, seed=20240601):
    rng = np.random.default_rng(seed)
    for case in range(count):
        ts = random_ts(rng)
        spec, ref = random_spec(rng, ts)
        yield case, ts, spec, ref


def folds_or_empty(ts, spec) -> list[Fold]:
    try:
        return make_folds(ts, spec)
    except FoldError as e:
        assert "too short" in str(e) and "\n" not in str(e)
        return []


# --- property tests -----------------------------------------------------------------------


def test_make_folds_equals_the_brute_force_reference():
    n_folds = n_empty = n_holdout = 0
    for case, ts, spec, ref in random_cases():
        got = folds_or_empty(ts, spec)
        want = reference_folds(ts, **ref)
        assert got == want, f"case {case}: {spec} on {len(ts)} bars"
        n_folds += len(got)
        n_empty += not got
        n_holdout += sum(f.holdout is not None for f in got)
    # the generator must exercise both outcomes, and many folds, with and without holdout
    assert n_folds > 500 and 10 < n_empty < 250 and 100 < n_holdout < n_folds - 100, (n_folds, n_empty, n_holdout)


def test_no_test_window_is_a_window_selection_saw():
    """Over random specs: every fold's test window is disjoint from every fold's val window
    (in bars and in calendar time), and test windows never overlap each other; a step
    shorter than val + test is refused, with the keys to change."""
    checked = 0
    for case, ts, spec, _ in random_cases(count=200, seed=5):
        folds = folds_or_empty(ts, spec)
        vals = [range(*f.val) for f in folds]
        tests = [range(*f.test) for f in folds]
        for i, te in enumerate(tests):
            assert not any(set(te) & set(v) for v in vals), (case, spec)
            assert not any(set(te) & set(other) for j, other in enumerate(tests) if j != i), (case, spec)
            times = (ts[te.start], ts[te.stop - 1])
            assert not any(ts[v.start] <= times[1] and times[0] <= ts[v.stop - 1] for v in vals), (case, spec)
            checked += 1
    assert checked > 300
    with pytest.raises(FoldError, match=r"folds.step: '5d' is shorter than val \+ test .*use step >= val \+ test"):
        FoldSpec(val="5d", test="5d", step="5d").validate()
    FoldSpec(val="5d", test="5d", step="10d").validate()


def calendar_ks(ts, i, offset, step) -> tuple[int, int]:
    """The k >= 0 for which boundary T = ts[0] + k*step + offset falls between bars
    i-1 and i, i.e. ts[i-1] < T <= ts[i] (i == 0: T <= ts[0]; i == n: T > ts[-1])."""
    t0, n = int(ts[0]), len(ts)
    lo = 0 if i == 0 else (int(ts[i - 1]) - t0 - offset) // step + 1
    hi = 10**18 if i == n else (int(ts[i]) - t0 - offset) // step
    return max(lo, 0), hi  # inclusive


def check_invariants(fold_list, ts, ref, case):
    n = len(ts)
    embargo, step = ref["embargo"], ref["step"]
    train, val, test = ref["train"], ref["val"], ref["test"]
    if ref["max_folds"] is not None:
        assert len(fold_list) <= ref["max_folds"]
    prev, prev_k = None, -1
    for j, fold in enumerate(fold_list):
        (a, b), (c, d), (e, f) = fold.train, fold.val, fold.test
        msg = f"case {case} fold {j}: {fold}"
        assert fold.k == j, msg
        holdout = ref["holdout"]
        assert (fold.holdout is not None) == bool(holdout), msg
        if holdout:  # training | embargo | holdout | embargo | val: no bar is in two of them
            s0, s1 = fold.holdout
            assert s0 == b + embargo and s0 < s1 and c == s1 + embargo, msg
            training_end, b = b, s1  # the holdout window ends where an unsplit train window would
        assert 0 <= a < b and c == b + embargo and c < d and e == d + embargo and e < f <= n, msg
        if ref["anchored"]:
            assert a == 0, msg
        # every boundary is one calendar grid point k: T1 = T0 + k*step + train, T2 = T1 + val,
        # T3 = T2 + test and (rolling) the train start T0 + k*step
        bounds = [
            calendar_ks(ts, b, train, step),
            calendar_ks(ts, d, train + val, step),
            calendar_ks(ts, f, train + val + test, step),
        ]
        if not ref["anchored"]:
            bounds.append(calendar_ks(ts, a, 0, step))
        if holdout:  # training ends on the same grid point, `holdout` before val's start
            bounds.append(calendar_ks(ts, training_end, train - holdout, step))
        k_lo, k_hi = max(lo for lo, _ in bounds), min(hi for _, hi in bounds)
        assert k_lo <= k_hi, msg
        assert k_lo >= prev_k, msg  # folds in calendar order
        if prev is not None:  # and in bar order
            for x, y in zip((*prev.train, *prev.val, *prev.test), (a, fold.train[1], c, d, e, f)):
                assert x <= y, msg
        prev, prev_k = fold, k_lo


def test_every_fold_keeps_its_invariants():
    checked = 0
    for case, ts, spec, ref in random_cases(count=150, seed=7):
        fold_list = folds_or_empty(ts, spec)
        check_invariants(fold_list, ts, ref, case)
        checked += len(fold_list)
    assert checked > 200


def test_rolling_train_starts_advance_by_step_on_a_regular_grid():
    ts = T0 + np.arange(60 * 1440, dtype=np.int64) * MIN_NS  # 60 days of minute bars
    rolling = make_folds(ts, FoldSpec(train="10d", val="2d", test="3d", step="6d", embargo=5))
    anchored = make_folds(ts, FoldSpec(train="10d", val="2d", test="3d", step="6d", embargo=5, anchored=True))
    assert len(rolling) == len(anchored) == 8  # 10+2+3 + 6k <= 60  ->  k = 0..7
    for k, (r, a) in enumerate(zip(rolling, anchored)):
        assert r.train == (6 * k * 1440, (6 * k + 10) * 1440)
        assert a.train == (0, (6 * k + 10) * 1440)
        assert r.val == a.val == ((6 * k + 10) * 1440 + 5, (6 * k + 12) * 1440)
        assert r.test == a.test == ((6 * k + 12) * 1440 + 5, (6 * k + 15) * 1440)


def test_hand_computed_folds_with_weekend_holes():
    # hourly bars closing Mon 01:00 .. Sat 00:00 (120 per week), four weeks, no weekends
    ts = np.array([T0 + w * 7 * DAY_NS + h * 3600 * 10**9 for w in range(4) for h in range(1, 121)], dtype=np.int64)
    fold_list = make_folds(ts, FoldSpec(train="1w", val="3d", test="4d", step="1w", embargo=2))
    # Windows start at the first close, Mon 01:00 of week 0. Fold k: train = the 120 bars
    # of week k; val = Mon 01:00 .. Thu 01:00 of week k+1 = its bars h = 1..72; test =
    # Thu 01:00 .. next Mon 01:00 = its bars h = 73..120 (the weekend has none). A third
    # fold would end at Mon 01:00 of week 4, past the last close (Sat 00:00 of week 3) + 1 h.
    assert [f.as_dict() for f in fold_list] == [
        {"k": 0, "train": [0, 120], "val": [122, 192], "test": [194, 240]},
        {"k": 1, "train": [120, 240], "val": [242, 312], "test": [314, 360]},
    ]


def test_a_test_window_ending_one_bar_after_the_last_close_is_covered():
    ts = T0 + np.arange(30 * 24, dtype=np.int64) * 3600 * 10**9  # closes T0 .. T0 + 30d - 1h
    spec = FoldSpec(train="20d", val="5d", test="5d", embargo=2)
    assert [f.as_dict() for f in make_folds(ts, spec)] == [
        {"k": 0, "train": [0, 480], "val": [482, 600], "test": [602, 720]}
    ]
    with pytest.raises(FoldError, match="too short"):
        make_folds(ts[:-1], spec)


def test_bar_spacing_is_the_typical_gap():
    minute = T0 + np.arange(14 * 1440, dtype=np.int64) * MIN_NS
    weekdays = minute[(minute - T0) % (7 * DAY_NS) < 5 * DAY_NS]  # weekends removed
    assert folds.bar_spacing(weekdays) == MIN_NS
    assert folds.bar_spacing(np.array([T0, T0 + 5, T0 + 7, T0 + 100])) == 5  # median of 5, 2, 93
    assert folds.bar_spacing(np.array([T0])) == 1


def test_a_long_outage_does_not_stretch_the_covered_end():
    """The coverage rule uses the typical bar (1 h here), not the mean gap (~2.2 h)."""
    hourly = T0 + np.arange(30 * 24, dtype=np.int64) * 3600 * 10**9
    day = (hourly - T0) // DAY_NS
    ts = hourly[(day < 2) | (day >= 18)]  # days 2..17 missing
    spec = FoldSpec(train="20d", val="5d", test="5d", embargo=2)
    assert len(make_folds(ts, spec)) == 1  # the test window ends exactly one bar after the last
    with pytest.raises(FoldError, match="too short"):
        make_folds(ts[:-1], spec)


def test_max_folds_keeps_the_first_folds():
    ts = T0 + np.arange(60 * 24, dtype=np.int64) * 3600 * 10**9
    spec = dict(train="10d", val="2d", test="3d", embargo=3)
    every = make_folds(ts, FoldSpec(**spec))
    assert len(every) > 3
    assert make_folds(ts, FoldSpec(**spec, max_folds=3)) == every[:3]
    assert make_folds(ts, FoldSpec(**spec, max_folds=100)) == every


# --- the embargo and look-ahead ----------------------------------------------------------


def test_default_embargo_is_the_longest_lookback_plus_one():
    import fxray.data.features as features

    assert folds.default_embargo() == features.MAX_LOOKBACK + 1
    if hasattr(features, "LOOKBACKS"):  # the embargo must cover every feature's window
        assert features.MAX_LOOKBACK >= max(features.LOOKBACKS)
    ts = T0 + np.arange(40 * 1440, dtype=np.int64) * MIN_NS
    for fold in make_folds(ts, FoldSpec()):
        assert fold.val[0] - fold.train[1] == features.MAX_LOOKBACK + 1
        assert fold.test[0] - fold.val[1] == features.MAX_LOOKBACK + 1


def test_no_feature_window_or_reward_crosses_a_boundary():
    """The last train bar's 1-bar reward reads close[b]; the first val bar's feature
    window reads bars c - L .. c. They must not meet (same for val | test)."""
    L = max_lookback()
    checked = 0
    for case, ts, spec, _ in random_cases(count=120, seed=11):
        for fold in folds_or_empty(ts, dataclasses.replace(spec, embargo=None)):
            (_, b), (c, d), (e, _) = fold.train, fold.val, fold.test
            last_train_reward_reads = b  # close[(b - 1) + 1]
            assert c - L > last_train_reward_reads, (case, fold)
            assert c - (b - 1) > L, (case, fold)
            assert e - L > d, (case, fold)
            assert e - (d - 1) > L, (case, fold)
            checked += 1
    # coarse random specs rarely leave room for a 121-bar embargo: use minute bars
    ts = T0 + np.arange(50 * 1440, dtype=np.int64) * MIN_NS
    for fold in make_folds(ts, FoldSpec(train="5d", val="1d", test="1d", step="2d")):
        assert fold.val[0] - L > fold.train[1] and fold.test[0] - L > fold.val[1]
        checked += 1
    assert checked > 20


# --- parse_duration --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,ns",
    [
        ("30d", 30 * DAY_NS),
        ("12h", 12 * 60 * MIN_NS),
        ("90min", 90 * MIN_NS),
        ("2w", 14 * DAY_NS),
        (" 1.5d ", 36 * 60 * MIN_NS),
        (".5h", 30 * MIN_NS),
        ("3 h", 3 * 60 * MIN_NS),
        (7, 7 * DAY_NS),
        (0.25, 6 * 60 * MIN_NS),
        (np.int64(3), 3 * DAY_NS),
        (np.float64(2.0), 2 * DAY_NS),
        ("1min", MIN_NS),
        ("10s", MIN_NS // 6),
    ],
)
def test_parse_duration_accepts(text, ns):
    assert parse_duration(text, "folds.train") == ns


@pytest.mark.parametrize(
    "text",
    [
        "abc",
        "",
        "5",
        "5m",
        "5 days",
        "d",
        "1e3d",
        "-5d",
        "+5d",
        "0d",
        "0min",
        "0.0h",
        "5d5h",
        0,
        -1,
        -0.5,
        0.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        True,
        False,
        None,
        [5],
        "1e-20min",
    ],
)
def test_parse_duration_rejects(text):
    with pytest.raises(FoldError) as err:
        parse_duration(text, "folds.val")
    msg = str(err.value)
    assert msg.startswith("folds.val:") and "\n" not in msg, msg


# --- too-short data and bad input ---------------------------------------------------------


def test_too_short_data_says_what_it_has_and_what_it_needs():
    ts = T0 + np.arange(10 * 1440, dtype=np.int64) * MIN_NS  # 10 days of minute bars
    with pytest.raises(FoldError) as err:
        make_folds(ts, FoldSpec(train="20d", val="5d", test="5d"))
    msg = str(err.value)
    assert "\n" not in msg
    for needle in (
        "too short",
        "14,400 bars",
        "10.00 days",
        "train 20d",
        "val 5d",
        "test 5d",
        f"embargo of {max_lookback() + 1} bars",
    ):
        assert needle in msg, (needle, msg)


def test_too_short_because_the_embargo_eats_the_val_window():
    ts = T0 + np.arange(200, dtype=np.int64) * DAY_NS  # 200 daily bars: val 5d has 5 bars
    with pytest.raises(FoldError, match=r"200 bars spanning 199\.00 days.*embargo of 121 bars"):
        make_folds(ts, FoldSpec(train="20d", val="5d", test="5d"))
    assert make_folds(ts, FoldSpec(train="20d", val="5d", test="5d", embargo=4))


def test_a_single_bar_is_too_short():
    with pytest.raises(FoldError) as err:
        make_folds(np.array([T0]), FoldSpec(train="1d", val="1d", test="1d", embargo=1))
    assert "\n" not in str(err.value) and "1 bars" in str(err.value)


@pytest.mark.parametrize(
    "field,value,key",
    [
        ("embargo", 0, "folds.embargo"),
        ("embargo", -3, "folds.embargo"),
        ("embargo", 2.5, "folds.embargo"),
        ("embargo", "5", "folds.embargo"),
        ("embargo", True, "folds.embargo"),
        ("max_folds", 0, "folds.max_folds"),
        ("max_folds", -1, "folds.max_folds"),
        ("max_folds", 1.5, "folds.max_folds"),
        ("max_folds", "3", "folds.max_folds"),
        ("max_folds", True, "folds.max_folds"),
        ("train", "abc", "folds.train"),
        ("train", "0d", "folds.train"),
        ("val", -1, "folds.val"),
        ("val", "5 days", "folds.val"),
        ("test", "", "folds.test"),
        ("test", None, "folds.test"),
        ("step", "x", "folds.step"),
        ("step", 0, "folds.step"),
    ],
)
def test_spec_validate_names_the_key(field, value, key):
    spec = FoldSpec(**{field: value})
    with pytest.raises(FoldError) as err:
        spec.validate()
    msg = str(err.value)
    assert msg.startswith(f"{key}:") and "\n" not in msg, msg
    ts = T0 + np.arange(40 * 24, dtype=np.int64) * 3600 * 10**9
    with pytest.raises(FoldError, match=key):  # make_folds validates before anything else
        make_folds(ts, spec)


def test_valid_specs_pass_validation():
    for spec in (
        FoldSpec(),
        FoldSpec(embargo=1, max_folds=1, step="10d", anchored=True),
        FoldSpec(train=30, val=0.5, test="90min", embargo=np.int64(4)),
    ):
        spec.validate()


def test_fold_as_dict():
    fold = Fold(2, (0, 10), (13, 20), (23, 30))
    assert fold.as_dict() == {"k": 2, "train": [0, 10], "val": [13, 20], "test": [23, 30]}
    assert Fold.from_dict(fold.as_dict()) == fold  # what a FoldWorker gets back from JSON
    assert fold.chooser == (13, 20)
    held = Fold(2, (0, 6), (13, 20), (23, 30), holdout=(8, 10))
    assert held.as_dict()["holdout"] == [8, 10] and Fold.from_dict(held.as_dict()) == held
    assert held.chooser == (8, 10)


def test_a_select_window_is_the_train_windows_end_behind_an_embargo():
    """By hand on a regular grid: the same folds as without holdout, but training stops
    `holdout` + embargo before val; the holdout window is what is left of the train window."""
    ts = T0 + np.arange(40 * 1440, dtype=np.int64) * MIN_NS
    plain = make_folds(ts, FoldSpec(train="10d", val="2d", test="3d", embargo=5))
    held = make_folds(ts, FoldSpec(train="10d", val="2d", test="3d", embargo=5, holdout="2d"))
    assert len(plain) == len(held) == 6  # 10 + 2 + 3 + 5k <= 40  ->  k = 0..5
    for p, h in zip(plain, held):
        assert (h.val, h.test) == (p.val, p.test)
        assert h.train == (p.train[0], p.train[1] - 2 * 1440)
        assert h.holdout == (h.train[1] + 5, p.train[1])
    # holdout >= train is refused, naming the key
    with pytest.raises(FoldError, match=r"^folds.holdout: '10d' is not shorter than folds.train"):
        make_folds(ts, FoldSpec(train="10d", holdout="10d"))
    with pytest.raises(FoldError, match=r"^folds.holdout: 'x' is not a duration"):
        FoldSpec(holdout="x").validate()
    with pytest.raises(FoldError, match=r"held out to choose epochs"):  # too short says why
        make_folds(ts[: 12 * 1440], FoldSpec(train="10d", val="1d", test="1d", holdout="10min", embargo=30))
