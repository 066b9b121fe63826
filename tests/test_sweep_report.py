"""scripts/sweep_report.py: the wall-time split of a sweep from its workers' call logs, and its
chosen trial in the last screen's words."""

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("sweep_report", Path(__file__).parents[1] / "scripts/sweep_report.py")
sweep_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep_report)


def test_split_of_a_hand_made_sweep(tmp_path):
    # wall 0..20 s, two workers. w0: warmup 2-4, trial a folds 5-7 and 7.5-9, trial b 9.1-12
    # (cancelled 12-12.2), trial c 12.3-18. w1: trial d 6-19.
    calls0 = [
        [102, 104, None, 0, "warmup"],
        [105, 107, "a", 0, "ok"],
        [107.5, 109, "a", 1, "ok"],
        [109.1, 112, "b", 0, "ok"],
        [112, 112.2, "b", 1, "cancelled"],
        [112.3, 118, "c", 0, "ok"],
    ]
    calls1 = [[106, 119, "d", 0, "ok"]]
    results = {
        "experiment": "x",
        "profile": "gpu",
        "n_trials": 4,
        "wall_s": 20.0,
        "started": 100.0,
        "trials": [{"folds": [{}]}] * 3 + [{"folds": [{"timings": {"trial_start": 104.5}}]}],
        "best": {"trial_id": "c", "score": 1.0, "mean_test_sharpe": 0.9, "test": {"sharpe": 0.5}},
        "workers": [{"device": "cuda:0", "calls": calls0}, {"device": "cuda:0", "calls": calls1}],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    r = sweep_report.report(str(path))
    total = 2 * 20.0
    training = (2 + 1.5 + 2.9 + 5.7) + 13
    assert r["training_share"] == pytest.approx(training / total)
    assert r["cancelled_share"] == pytest.approx(0.2 / total)
    assert r["warmup_share"] == pytest.approx(2 / total)
    assert r["startup_share"] == pytest.approx((2 + 1 + 6) / total)  # w0: 2 + gap after warmup 1; w1: 6
    assert r["within_share"] == pytest.approx(0.5 / total)
    assert r["between_share"] == pytest.approx((0.1 + 0.1) / total)  # a->b, b(cancelled)->c
    assert r["tail_share"] == pytest.approx((2 + 1) / total)
    parts = [r[f"{k}_share"] for k in ("training", "cancelled", "warmup", "startup", "within", "between", "tail")]
    assert sum(parts) == pytest.approx(1.0)
    assert r["dispatch_gap_mean_s"] == pytest.approx(0.1) and r["cancelled_folds"] == 1
    assert r["gpu_workers"] == 2 and r["trials_per_hour"] == pytest.approx(4 * 3600 / 20)
    assert r["t_first_trial_started"] == pytest.approx(4.5) and r["t_first_trial_fold"] == pytest.approx(5.0)
    assert r["t_last_fold_end"] == pytest.approx(19.0)
    # the chosen trial's numbers are the last screen's: its score and pooled test Sharpe
    assert (r["chosen_trial"], r["chosen_score"], r["chosen_pooled_test_sharpe"]) == ("c", 1.0, 0.5)
    assert not any("best" in k for k in r)


def test_speedup_of_two_hand_made_sweeps(tmp_path):
    def sweep(wall, trials):  # trials: (lr, [(val Sharpe, fold seconds), ...])
        return {
            "wall_s": wall,
            "trials": [
                {
                    "sampled": {"lr": lr},
                    "folds": [{"val": {"sharpe": v}, "timings": {"fold_time_s": s}} for v, s in folds],
                }
                for lr, folds in trials
            ],
        }

    one = sweep(10.0, [(0.1, [(1.0, 3.0), (2.0, 3.0)]), (0.2, [(0.5, 3.0)])])
    two = sweep(5.0, [(0.2, [(0.75, 3.0)]), (0.1, [(1.0, 2.0), (2.0, 4.0)])])  # same work, other order
    for name, r in (("one", one), ("two", two)):
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    pair = sweep_report.speedup(str(tmp_path / "one.json"), str(tmp_path / "two.json"))
    assert pair["same_work"] and pair["folds_a"] == pair["folds_b"] == 3
    assert pair["speedup"] == pytest.approx(2.0) and pair["val_sharpe_max_abs_diff"] == pytest.approx(0.25)
    assert pair["work_rate_a"] == pytest.approx(0.9) and pair["work_rate_b"] == pytest.approx(1.8)
    assert pair["work_rate_speedup"] == pytest.approx(2.0)
    two["trials"][0]["folds"].append({"val": {"sharpe": 0.0}, "timings": {"fold_time_s": 1.0}})
    (tmp_path / "two.json").write_text(json.dumps(two))
    assert not sweep_report.speedup(str(tmp_path / "one.json"), str(tmp_path / "two.json"))["same_work"]
