"""No import cycle among sosim's modules: every ``import`` / ``from ... import`` of a sosim module, at module
level or inside a function (a deferred import still ties the two modules together), read with ``ast``, makes
an edge; the graph must have no cycle. A package's ``__init__`` counts as the package."""

from __future__ import annotations

import ast
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
    assert "sosim.costs.table" in g["sosim.answers.simulate"]  # imported inside make_cost_model


def test_no_import_cycle_among_sosim_modules() -> None:
    found = [c for c in cycles(graph()) if c not in KNOWN]
    assert not found, "import cycles: " + "; ".join(", ".join(sorted(c)) for c in found)


# The packages, lowest first: a module may import from its own package and from those before it. What sosim is
# made of (inputs: the schema; hardware; costs), what runs it (engine; schedules: the systems), what it answers
# and the formats it reads and writes, and the calibration harness, which runs on GPU machines.
LAYERS = ("inputs", "hardware", "costs", "engine", "schedules", "formats", "answers", "calibrate")
# Imports that still reach up a layer, each with why; nothing else may join (remove an entry once it is gone).
KNOWN_UPWARD = {
    # Loading resolves a scenario completely (issue 17: knob validation belongs to loading; the cost model never
    # searches folders): the loader asks the registry for the knobs and reads the profile's tables.
    ("sosim.inputs.loader", "sosim.schedules.registry"),
    ("sosim.inputs.loader", "sosim.costs.table"),
    # Per-tensor sizes of a layer, which the measured ZeRO-2 flush is scaled by, live with the layout.
    ("sosim.costs.offload_mechanisms", "sosim.schedules.layout"),
    # The calibration CSV's column names are the harness's (it runs standalone on GPU machines).
    ("sosim.costs.calibration_table", "sosim.calibrate.records"),
    # DeepSpeed's key names and defaults (data) are read by each system's DeepSpeed form.
    ("sosim.schedules.offload_ds", "sosim.formats.dsconfig.schema"),
    ("sosim.schedules.superoffload_ds", "sosim.formats.dsconfig.schema"),
    ("sosim.schedules.system_api", "sosim.formats.dsconfig.schema"),
    ("sosim.schedules.zero3_ds", "sosim.formats.dsconfig.schema"),
    # Traces and plots draw a Result.
    ("sosim.formats.plot", "sosim.answers.result"),
    ("sosim.formats.trace", "sosim.answers.result"),
}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else None


def test_the_layout_shows_the_architecture() -> None:
    """Every module of sosim/ but the entry points (__init__, __main__, cli) lives in one of the packages."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py"]
    assert {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} == {*LAYERS, "schedules"}


def test_no_package_reaches_up_a_layer() -> None:
    g = graph()
    upward = {(src, dst) for src, dsts in g.items() for dst in dsts
              if (a := _layer(src)) is not None and (b := _layer(dst)) is not None and b > a}
    assert upward <= KNOWN_UPWARD, "imports that reach up a layer: " + "; ".join(
        f"{s} -> {d}" for s, d in sorted(upward - KNOWN_UPWARD))
    assert upward == KNOWN_UPWARD, f"gone, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"
