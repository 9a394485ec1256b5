"""The import layers of ``pipeline/specbuild`` as docs/architecture.md draws them, held against the code's imports.

Every import anywhere in a file is an arrow (inside functions and under ``TYPE_CHECKING`` too: a lazy import ties
two modules all the same). The house holds when no modules import each other in a circle (inside one package
too) and no arrow runs back up from a floor to a higher one, but the one allowed. Read with the standard library
only, so the layering stays as drawn without any other tool. A name imported through ``importlib`` (the package's
lazy public API) is no arrow here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from locations import REPO_ROOT

PACKAGE = "specbuild"
SOURCE = REPO_ROOT / "pipeline" / PACKAGE

# The floors, bottom up, in docs/architecture.md's order (read from its foot): the package's top-level modules and
# sub-packages on each. A module imports only from its own floor or below; peers on one floor may import each other,
# never in a circle. ``__init__`` is the package's own (its public API, loaded on first use).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "terminal"),
    ("speculation", "capture"),
    ("spec_section", "spec_sources"),
    ("spec",),
    ("stages", "checkpoint", "spec_rendering"),
    ("package",),
    ("triton_models",),
    ("runtimes",),
    ("check", "monitoring"),
    ("serve",),
    ("doctor",),
    ("compiler",),
    ("bench",),
    ("drafts", "starter"),
    ("demo", "gpu_check"),
    ("cli", "__init__"),
)
# The one arrow upwards: the spec names the runtimes and composes their sections through these two modules, which
# import only each runtime's settings.py, never a runtime.
UPWARD = frozenset({("specbuild.spec", "specbuild.runtimes.names"), ("specbuild.spec", "specbuild.runtimes.settings")})

Graph = Mapping[str, Mapping[str, int]]  # module -> {module it imports: the line of the first such import}


def module_name(path: Path, source: Path) -> str:
    """``specbuild.a.b`` for ``<source>/a/b.py``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(source.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_imports(source: Path) -> dict[str, dict[str, int]]:
    """The import graph of the package at ``source``: each module's arrows to the package's other modules.

    ``from pkg import name`` is an arrow to ``pkg.name`` where that is a module, else to ``pkg``; relative imports
    are resolved against the importing module's package."""
    files = {module_name(path, source): path for path in sorted(source.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        arrows: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            for name in names:
                target = _known(name, files)
                if target is not None and target != module:
                    arrows[target] = min(arrows.get(target, node.lineno), node.lineno)
        graph[module] = arrows
    return graph


def _known(name: str, modules: Iterable[str]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (``a.b.c`` imported: module ``a.b`` if no ``a.b.c``)."""
    parts = name.split(".")
    known = set(modules)
    return next((".".join(parts[:end]) for end in range(len(parts), 0, -1) if ".".join(parts[:end]) in known), None)


def circles(graph: Graph) -> list[list[str]]:
    """The modules that import each other in a loop: each strongly connected component of two or more (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.get(module, {}):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def floor_of(module: str, floors: tuple[tuple[str, ...], ...]) -> int | None:
    """The floor (0 = the ground) that ``module``'s top-level module or sub-package stands on; None if on none."""
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    return next((number for number, rooms in enumerate(floors) if room in rooms), None)


def layer_problems(graph: Graph, floors: tuple[tuple[str, ...], ...], upward: frozenset[tuple[str, str]]) -> list[str]:
    """What breaks the layering, one clear line each: a module on no floor, a circle, an arrow running back up."""
    problems = [f"{module} stands on no floor: place it in FLOORS (tests/test_layers.py) and docs/architecture.md"
                for module in sorted(graph) if floor_of(module, floors) is None]
    for component in circles(graph):
        ties = ", ".join(f"{module} -> {target} (line {line})" for module in component
                         for target, line in sorted(graph[module].items()) if target in component)
        problems.append(f"import circle among {', '.join(component)}: {ties}")
    for module in sorted(graph):
        low = floor_of(module, floors)
        for target, line in sorted(graph[module].items()):
            high = floor_of(target, floors)
            if low is not None and high is not None and high > low and (module, target) not in upward:
                problems.append(f"{module} (floor {low + 1}) imports {target} (floor {high + 1}) at line {line}: an "
                                f"arrow back up; move what it needs down, or {module} up")
    return problems


def test_the_package_keeps_its_layers():
    graph = read_imports(SOURCE)
    assert {"specbuild.spec", "specbuild.cli.serving", "specbuild.runtimes.torch.engine"} <= set(graph)
    problems = layer_problems(graph, FLOORS, UPWARD)
    assert not problems, "the import layers are broken:\n" + "\n".join(problems)


def test_every_floor_names_what_is_there():
    rooms = {module.split(".")[1] if "." in module else "__init__" for module in read_imports(SOURCE)}
    named = [room for rooms_on_floor in FLOORS for room in rooms_on_floor]
    assert len(named) == len(set(named)), "a room on two floors"
    assert set(named) == rooms, f"FLOORS names what is not there: {sorted(set(named) - rooms)}"


def test_the_allowed_upward_arrows_are_still_there():
    graph = read_imports(SOURCE)
    assert all(target in graph[module] for module, target in UPWARD), "an allowed arrow is gone: drop it from UPWARD"


MADE_UP_FLOORS = (("low",), ("high",))


def test_the_checker_finds_a_circle_inside_one_package():
    graph = {"specbuild.low.a": {"specbuild.low.b": 3}, "specbuild.low.b": {"specbuild.low.c": 4},
             "specbuild.low.c": {"specbuild.low.a": 5}, "specbuild.high.d": {"specbuild.low.a": 1}}
    assert circles(graph) == [["specbuild.low.a", "specbuild.low.b", "specbuild.low.c"]]
    (problem,) = layer_problems(graph, MADE_UP_FLOORS, frozenset())
    assert problem.startswith("import circle among specbuild.low.a, specbuild.low.b, specbuild.low.c: ")
    assert "specbuild.low.c -> specbuild.low.a (line 5)" in problem


def test_the_checker_finds_an_arrow_back_up_unless_allowed():
    graph = {"specbuild.low.a": {"specbuild.high.b": 7}, "specbuild.high.b": {}, "specbuild.high.c": {"specbuild.low.a": 2}}
    (problem,) = layer_problems(graph, MADE_UP_FLOORS, frozenset())
    assert problem.startswith("specbuild.low.a (floor 1) imports specbuild.high.b (floor 2) at line 7: an arrow back up")
    assert circles(graph) == []
    assert layer_problems(graph, MADE_UP_FLOORS, frozenset({("specbuild.low.a", "specbuild.high.b")})) == []


def test_the_checker_finds_a_module_on_no_floor():
    graph = {"specbuild.low.a": {}, "specbuild.attic": {"specbuild.low.a": 1}}
    assert layer_problems(graph, MADE_UP_FLOORS, frozenset()) == [
        "specbuild.attic stands on no floor: place it in FLOORS (tests/test_layers.py) and docs/architecture.md"]


def test_lazy_relative_and_module_imports_are_arrows(tmp_path: Path):
    source = tmp_path / PACKAGE
    (source / "low").mkdir(parents=True)
    for name in ("__init__.py", "low/__init__.py", "low/a.py"):
        (source / name).write_text("", encoding="utf-8")
    (source / "low" / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                         "    from specbuild.high import c\n", encoding="utf-8")
    (source / "high.py").write_text("import os\n\n\ndef late():\n    from .low import a, b\n"
                                    "    import specbuild.low\n", encoding="utf-8")
    graph = read_imports(source)
    assert graph["specbuild.high"] == {"specbuild.low.a": 5, "specbuild.low.b": 5, "specbuild.low": 6}
    assert graph["specbuild.low.b"] == {"specbuild.high": 4}  # ``c`` is no module: the arrow is to its module
    assert circles(graph) == [["specbuild.high", "specbuild.low.b"]]
