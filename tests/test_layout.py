"""The tree keeps the shape the README's Layout section describes: every import points down a
floor, the layers import only common/ and the layers before them, no module imports itself back
through a cycle, and the pure transforms load no configuration."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# A package may import its own modules and any package on a lower floor.
FLOORS = {"common": 1, "tools": 2, "bronze": 2, "silver": 2, "gold": 2, "pipeline": 3,
          "audit": 4, "chaos": 5, "bench": 5, "console": 6}
LAYERS = ("bronze", "silver", "gold")          # a layer reads only the ones before it


def modules():
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            yield package, path


def imports(path: Path, top_level_only: bool = False):
    """(line, imported module) of a file; the `if __name__ == "__main__":` entry is left out (it
    is how the module is run, not what it depends on)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and getattr(node.test.left, "id", None) == "__name__"):
            skip.update(id(n) for n in ast.walk(node))
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def allowed(package: str, target: str) -> bool:
    if target == package or target not in FLOORS:
        return True
    if package in LAYERS and target in LAYERS:
        return LAYERS.index(target) < LAYERS.index(package)
    return FLOORS[target] < FLOORS[package]


def test_every_import_points_down_a_floor():
    wrong = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for package, path in modules() for line, module in imports(path)
             if not allowed(package, module.split(".")[0])]
    assert not wrong, "imports against the layout:\n" + "\n".join(wrong)


def test_no_import_cycle_between_modules():
    names = {}
    for _, path in modules():
        rel = path.relative_to(REPO).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        names[".".join(parts)] = path
    graph = {name: {m for _, m in imports(path, top_level_only=True) if m in names and m != name}
             for name, path in names.items()}
    done, cycles = set(), []

    def visit(node, stack):
        if node in stack:
            cycles.append(" -> ".join(stack[stack.index(node):] + [node]))
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, stack + [node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("layer", LAYERS)
def test_transforms_take_resolved_arguments(layer):
    """A transform gets its profile and settings from the caller: it never reads the config
    itself, and no module keeps old names alive through a module-level __getattr__."""
    path = REPO / layer / "transform.py"
    tree = ast.parse(path.read_text())
    loads = [n.lineno for n in ast.walk(tree)
             if isinstance(n, ast.Name) and n.id in ("load_config", "default_profile")]
    assert not loads, f"{path.name} loads configuration itself (lines {loads})"
    shims = [f"{p.relative_to(REPO)}" for _, p in modules()
             if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in ast.parse(p.read_text()).body)]
    assert not shims, f"module-level __getattr__ shims: {shims}"


def test_the_layout_test_catches_an_upward_import(tmp_path):
    """The floor rule itself: a layer importing the pipeline, or silver importing gold, fails."""
    assert not allowed("silver", "pipeline")
    assert not allowed("silver", "gold")
    assert not allowed("common", "tools")
    assert allowed("gold", "silver") and allowed("pipeline", "gold") and allowed("chaos", "audit")
    probe = tmp_path / "probe.py"
    probe.write_text("from pipeline.cli import main\nif __name__ == '__main__':\n    import bench.run\n")
    assert [m for _, m in imports(probe)] == ["pipeline.cli"]


# The one stop itself, and the plain-Spark baselines the bench compares against (plain on purpose).
PLAIN_STOPS = {"common/spark.py", "common/internals.py", "bench/baseline.py", "bench/baseline_stream.py"}


def test_sessions_are_stopped_by_common_spark_stop():
    """A tool that builds its own session stops it with common.spark.stop (or its `session`
    block): a bare SparkSession.stop() waits for PySpark's accumulator server (up to a second
    per process) and lets the state stores' maintenance log a stack after a clean run."""
    bare = []
    for _, path in modules():
        if path.relative_to(REPO).as_posix() in PLAIN_STOPS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "stop"
                    and not node.args and "spark" in ast.unparse(node.func.value).lower()):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not bare, f"sessions stopped without common.spark.stop: {bare}"
