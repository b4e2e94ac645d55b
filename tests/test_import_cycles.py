"""No import cycle among sosim's modules: every ``import`` / ``from ... import`` of a sosim module, at module
level or inside a function (a deferred import still ties the two modules together), read with ``ast``, makes
an edge; the graph must have no cycle. A package's ``__init__`` counts as the package."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "sosim"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The sosim modules ``path`` imports (``from sosim.x import y`` is ``sosim.x.y`` when that is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            # The longest sosim module the target names (``sosim.a.b.func`` -> ``sosim.a.b``).
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t != "sosim":
                out.add(t)
    return out


@functools.lru_cache(maxsize=1)  # parsed once per session: five tests read it
def graph() -> dict[str, set[str]]:
    paths = [p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def cycles(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of ``g`` with more than one module: each holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


# None is tolerated (tune <-> tune_report, the last one, went with tune_result.py).
KNOWN: set[frozenset[str]] = set()


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_imports_are_edges() -> None:
    g = graph()
    assert "sosim.costs.table" in g["sosim.run.simulate"]  # imported inside make_cost_model
    assert "sosim.answers.calibration_check" in g["sosim.cli"]  # imported inside cmd_calibrate


def test_no_import_cycle_among_sosim_modules() -> None:
    found = [c for c in cycles(graph()) if c not in KNOWN]
    assert not found, "import cycles: " + "; ".join(", ".join(sorted(c)) for c in found)


# The packages, lowest first: a module may import from its own package and from those before it. The calibration
# harness (it runs standalone on GPU machines, so it imports nothing of sosim; the simulator reads its CSV columns),
# what sosim is made of (inputs: the schema; hardware: the machine and the model arithmetic; costs), what runs it
# (engine; schedules: the systems and DeepSpeed's key data), one run end to end (run: loader, simulate, Result), the
# formats it reads and writes, and what it answers.
LAYERS = ("calibrate", "inputs", "hardware", "costs", "engine", "schedules", "run", "formats", "answers")
# Imports that still reach up a layer, each with why; nothing may join (none is left: issue 25).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else None


def test_the_layout_shows_the_architecture() -> None:
    """Every module of sosim/ but the entry points (__init__, __main__, cli) lives in one of the packages."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py"]
    assert {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} == set(LAYERS)


def test_no_package_reaches_up_a_layer() -> None:
    g = graph()
    upward = {(src, dst) for src, dsts in g.items() for dst in dsts
              if (a := _layer(src)) is not None and (b := _layer(dst)) is not None and b > a}
    assert upward <= KNOWN_UPWARD, "imports that reach up a layer: " + "; ".join(
        f"{s} -> {d}" for s, d in sorted(upward - KNOWN_UPWARD))
    assert upward == KNOWN_UPWARD, f"gone, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"


def test_the_calibration_harness_imports_nothing_of_sosim() -> None:
    """sosim/calibrate/ runs from a copy of its folder on a GPU machine: only relative imports of its own modules."""
    g = graph()
    outside = {(src, dst) for src, dsts in g.items() if src.startswith("sosim.calibrate") for dst in dsts
               if not dst.startswith("sosim.calibrate")}
    assert not outside, f"sosim/calibrate/ imports the simulator: {sorted(outside)}"


def _loaded_by(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(m for m in sys.modules if m == 'sosim' or m.startswith('sosim.')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_a_small_module_loads_only_it() -> None:
    """Package __init__ files import nothing, so a leaf module does not load the simulator (it loaded 62 of
    117 modules before issue 25); the public API still resolves on first use."""
    face = {"sosim", "sosim.inputs", "sosim.inputs.version"}  # the package face and its one-constant version module
    assert _loaded_by("import sosim.inputs.units") == {*face, "sosim.inputs.units"}
    assert _loaded_by("import sosim.schedules.blocks.ds_schema") == {
        *face, "sosim.schedules", "sosim.schedules.blocks", "sosim.schedules.blocks.ds_schema"}
    loaded = _loaded_by("from sosim import load_scenario, simulate, sweep, Result")
    assert {"sosim.run.loader", "sosim.run.simulate", "sosim.run.result", "sosim.answers.sweep"} <= loaded
