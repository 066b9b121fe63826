"""Where a trial cuts its folds into leases: at the reports Ray's ASHA can stop it after."""

from types import SimpleNamespace

import numpy as np
import pytest
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from fxray.sweep.trial import asha_stops, segments


@pytest.mark.parametrize(
    "n, grace, rf",
    [
        (12, 1, 2),
        (4, 1, 2),
        (2, 2, 2),
        (1, 1, 2),
        (8, 1, 2),
        (9, 1, 3),
        (27, 1, 3),
        (10, 2, 2.5),
        (7, 3, 2),
        (16, 2, 4),
        (12, 1, 1.5),
    ],
)
def test_asha_stops_where_rays_asha_stops(n, grace, rf):
    """Drive Ray's own scheduler with 300 trials reporting random values in random order:
    the folds-done counts at which it said STOP are exactly asha_stops(...)."""
    sched = ASHAScheduler(time_attr="folds", metric="v", mode="max", max_t=n, grace_period=grace, reduction_factor=rf)
    rng = np.random.default_rng(0)
    trials = {f"t{i}": SimpleNamespace(trial_id=f"t{i}") for i in range(300)}
    for t in trials.values():
        sched.on_trial_add(None, t)
    reported = dict.fromkeys(trials, 0)
    stopped_at = set()
    while trials:
        tid = list(trials)[rng.integers(len(trials))]
        reported[tid] += 1
        if sched.on_trial_result(None, trials[tid], {"folds": reported[tid], "v": rng.normal()}) == TrialScheduler.STOP:
            stopped_at.add(reported[tid])
            del trials[tid]
    assert stopped_at == set(asha_stops(n, grace, rf))


def test_segments_cut_after_each_stop():
    folds = ["f0", "f1", "f2", "f3", "f4"]
    assert segments(folds, 0, [1, 2, 4, 5]) == [["f0"], ["f1"], ["f2", "f3"], ["f4"]]
    assert segments(folds[2:], 2, [1, 2, 4, 5]) == [["f2", "f3"], ["f4"]]  # a trial restored after 2 folds
    assert segments(folds[:2], 0, [2]) == [["f0", "f1"]]  # nothing to stop it in between: one lease
    assert segments(folds[:3], 0, [5]) == [["f0", "f1", "f2"]]
    assert segments([], 3, [1, 2]) == []
