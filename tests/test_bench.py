"""scripts/bench.py runs, at a tiny size on the CPU, every section it has: a benchmark that
nothing runs breaks unnoticed (its CUDA path is run on the GPU machine: docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


def test_bench_runs_every_section_at_a_tiny_size_and_prints_its_table(tmp_path, capsys, one_torch_thread):
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert (
        bench.main(["--device", "cpu", "--size", "tiny", "--sections", "data,upload,trainer", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())["rows"]
    sections = {r["section"] for r in rows}
    assert sections == {"data", "upload", "trainer"} and not any("FAILED" in r["what"] for r in rows)
    samples = next(r for r in rows if r["what"].endswith("gradient samples/s"))
    assert samples["value"] > 0
    table = capsys.readouterr().out
    assert table.splitlines()[1].split()[:3] == ["section", "what", "value"] and "gradient samples/s" in table


def test_bench_sweep_prints_where_a_hand_made_sweeps_wall_time_went(tmp_path, capsys):
    """Two workers over a 20 s wall (started at 100): the first fold starts at 105 and the last
    ends at 119. Worker 0 warms up at 102-104 and trains 105-107, 107.5-109, 110-118 (two gaps
    between its folds: 1.5 s, idle after its last: 1 s); worker 1 trains 106-119 (idle before:
    1 s) as a population of 2. Each part is the mean of the two workers' seconds in it; a fold's
    timings split its worker's runs, the rest of a run is `other`."""
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs0 = [[102, 104, 1, "warmup"], [105, 107, 1, "training"], [107.5, 109, 1, "training"], [110, 118, 1, "training"]]
    workers = [{"population_runs": runs0}, {"population_runs": [[106, 119, 2, "training"]]}]

    def fold(worker, switch, train, evals, total, population=1, epochs=2):
        timings = {"fold_switch_s": switch, "train_s": train, "eval_s": evals, "fold_time_s": total, "trial_start": 104}
        return {"worker": worker, "population": population, "epochs": epochs, "status": "ok", "timings": timings}

    old = {**fold(0, 9, 9, 9, 27), "timings": {"trial_start": 50}}  # an earlier session's fold: not counted
    trials = [
        {"folds": [fold(0, 0.5, 1, 0.5, 2), fold(0, 0, 0, 0, 1.5, epochs=0), old]},  # the second abstained
        {"folds": [fold(0, 1, 5, 1.5, 7.5)]},  # 0.5 s of its run is other
        {"folds": [fold(1, 0.5, 10, 2, 12.5, population=2)]},  # both members report the run
        {"folds": [fold(1, 0.5, 10, 2, 12.5, population=2)]},
    ]
    phases = {"validated": 100.5, "ray_up": 102, "tune_started": 103, "tune_done": 119.5}
    results = {"started": 100.0, "wall_s": 20.0, "phases": phases, "workers": workers, "n_trials": 4, "trials": trials}
    (tmp_path / "results.json").write_text(json.dumps(results))
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--sweep", str(tmp_path), "--json", str(out)]) == 0
    rows = {r["what"].split(" (")[0].strip(): r["value"] for r in json.loads(out.read_text())["rows"]}
    setup = {"fold_switch": (1.5 + 0.5) / 2, "abstained": 1.5 / 2, "other": (0.5 + 0.5) / 2}
    parts = {"start-up: Ray, workers, data, Tune's first trials": 5.0, "fold setup": sum(setup.values())}
    parts.update({"learner steps": (6 + 10) / 2, "val/test backtests and references": (2 + 2) / 2})
    parts.update({"overhead: Tune, Optuna, MLflow, the driver": 1.5 / 2 + 1.0, "idle: no fold for a worker": 1.0})
    assert {k: rows[k] for k in parts} == pytest.approx(parts) and sum(parts.values()) == pytest.approx(20.0)
    assert {k: rows[k] for k in setup} == pytest.approx(setup)
    assert rows["ray"] == 1.5 and rows["first_fold"] == 2.0 and rows["between_folds"] == 0.75
    assert rows["tune_end"] == 0.5 and rows["results"] == 0.5
    assert "learner steps (40%)" in capsys.readouterr().out
    assert bench.main(["--sweep", str(tmp_path / "none")]) == 2  # no results.json: one line, exit 2
