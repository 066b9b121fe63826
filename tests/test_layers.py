"""The layer rule (docs/architecture.md), checked on every import statement of fxray, lazy ones too.

    data/                 imports nothing else of fxray
    book/, eval/          data/
    rl/                   data/, eval/
    track/                data/, eval/
    sweep/                data/, eval/, rl/, track/
    policy/               data/, eval/, rl/
    the CLIs (fxray/*.py, */__main__.py) anything; nothing but a CLI imports sweep/.
Ray only in sweep/; mlflow only in track/ and the CLIs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fxray"
ALLOWED = {
    "data": {"data"},
    "book": {"book", "data"},
    "eval": {"eval", "data"},
    "rl": {"rl", "data", "eval"},
    "track": {"track", "data", "eval"},
    "sweep": {"sweep", "data", "eval", "rl", "track"},
    "policy": {"policy", "data", "eval", "rl"},
}
THIRD_PARTY = {"ray": {"sweep"}, "mlflow": {"track"}}  # who may import them, besides the CLIs


def layer_of(path: Path) -> str | None:
    """The layer of a module file, or None for a CLI (top level, or a package's __main__)."""
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1 or rel.name == "__main__.py":
        return None
    return rel.parts[0]


def imported(source: str) -> set[str]:
    """Top-level names imported anywhere in `source`: 'fxray.<layer>' for fxray, else the package."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "fxray" else [f"fxray.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            out.add(".".join(parts[:2]) if parts[0] == "fxray" and len(parts) > 1 else parts[0])
    return out


def violations(layer: str | None, source: str) -> list[str]:
    bad = []
    for name in sorted(imported(source)):
        if name.startswith("fxray."):
            target = name.split(".")[1]
            if layer is None or target not in ALLOWED:  # a CLI, or a top-level module: no rule
                continue
            if target not in ALLOWED[layer]:
                bad.append(f"{layer} imports {target}")
        elif name in THIRD_PARTY and layer is not None and layer not in THIRD_PARTY[name]:
            bad.append(f"{layer} imports {name}")
    return bad


def test_every_import_keeps_the_layer_rule():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        bad = violations(layer_of(path), path.read_text())
        if bad:
            found[str(path.relative_to(PACKAGE))] = bad
    assert found == {}


def test_the_rule_catches_an_edge_that_breaks_it():
    """The checker itself: a lazy upward import, a Ray import below sweep/, a CLI left free."""
    lazy_up = "def f():\n    from fxray.rl.trainer import Trainer\n"
    assert violations("data", lazy_up) == ["data imports rl"]
    assert violations("eval", "from fxray import rl\n") == ["eval imports rl"]
    assert violations("rl", "import ray.tune\n") == ["rl imports ray"]
    assert violations("track", "import fxray.sweep.driver\n") == ["track imports sweep"]
    assert violations("sweep", "from fxray.track.records import FoldRecord\nimport ray\n") == []
    assert violations(None, "import ray, mlflow\nfrom fxray.sweep import driver\n") == []
    assert layer_of(PACKAGE / "data" / "__main__.py") is None and layer_of(PACKAGE / "rl" / "dqn.py") == "rl"
