"""The layer rule (docs/architecture.md), checked on every import statement of fxray, lazy ones too.

    data/                 imports nothing else of fxray
    book/, eval/          data/
    rl/                   data/, eval/
    track/                data/, eval/
    sweep/                data/, eval/, rl/, track/
    policy/               data/, eval/, rl/
    the CLIs (fxray/*.py) anything; nothing but a CLI imports sweep/.
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
    """The layer of a module file, or None for a CLI (the top level: a layer holds no command)."""
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1:
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
    assert layer_of(PACKAGE / "data_cmd.py") is None and layer_of(PACKAGE / "rl" / "dqn.py") == "rl"
    assert not list(PACKAGE.glob("*/__main__.py"))  # a command lives at the top, not inside a layer


def module_edges() -> dict[str, set[str]]:
    """fxray module -> the fxray modules it imports (lazy and TYPE_CHECKING imports too; a
    `from fxray.x import y` of a submodule y is an edge to fxray.x.y)."""
    modules = {
        ".".join(("fxray", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    edges = {}
    for name, path in modules.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fxray"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                out |= subs or ({node.module} & modules.keys())
        edges[name] = out - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_between_fxray_modules():
    assert cycles(module_edges()) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the checker sees one
