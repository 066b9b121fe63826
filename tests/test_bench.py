"""scripts/bench.py runs, at a tiny size on the CPU, every section it has: a benchmark that
nothing runs breaks unnoticed (its CUDA path is run on the GPU machine: docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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
