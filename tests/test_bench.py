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
    1 s). Each part is the mean of the two workers' seconds in it."""
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs0 = [[102, 104, 1, "warmup"], [105, 107, 1, "training"], [107.5, 109, 1, "training"], [110, 118, 1, "training"]]
    workers = [
        {"population_runs": runs0, "run_parts": {"learner": 6, "backtest": 3, "fold_switch": 1.5, "other": 1}},
        {"population_runs": [[106, 119, 1, "training"]], "run_parts": {"learner": 10, "backtest": 2, "trainer": 1}},
    ]
    phases = {"validated": 100.5, "ray_up": 102, "tune_started": 103, "tune_done": 119.5}
    results = {"started": 100.0, "wall_s": 20.0, "phases": phases, "workers": workers, "n_trials": 4, "trials": []}
    (tmp_path / "results.json").write_text(json.dumps(results))
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--sweep", str(tmp_path), "--json", str(out)]) == 0
    rows = {r["what"].split(" (")[0].strip(): r["value"] for r in json.loads(out.read_text())["rows"]}
    parts = {"start-up: Ray, workers, data, Tune's first trials": 5.0, "fold setup": 1.75, "learner steps": 8.0}
    parts.update({"val/test backtests and references": 2.5, "overhead: Tune, Optuna, MLflow, the driver": 0.75 + 1.0})
    parts["idle: no fold for a worker"] = 1.0
    assert {k: rows[k] for k in parts} == pytest.approx(parts) and sum(parts.values()) == pytest.approx(20.0)
    assert rows["ray"] == 1.5 and rows["first_fold"] == 2.0 and rows["between_folds"] == 0.75
    assert rows["tune_end"] == 0.5 and rows["fold_switch"] == 0.75 and rows["trainer"] == 0.5
    assert "learner steps (40%)" in capsys.readouterr().out
    assert bench.main(["--sweep", str(tmp_path / "none")]) == 2  # no results.json: one line, exit 2
