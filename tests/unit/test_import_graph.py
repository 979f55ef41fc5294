"""The package's import graph has no cycle: each module sits above the ones it imports.

An edge is any import of a cdc_router module, at module level or inside a function (a deferred
import still ties the two modules together), except under `if TYPE_CHECKING:`. Importing
`cdc_router.a.b` from outside package `a` also runs `a/__init__.py`, so it is an edge to
`cdc_router.a` as well.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cdc_router"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`; `if TYPE_CHECKING:` bodies only when `typing`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test) and not typing:
            for other in child.orelse:
                yield from _imports(other, typing)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _imports(child, typing)


def _targets(statement: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
             modules: set[str]) -> set[str]:
    """The cdc_router modules one import statement loads."""
    if isinstance(statement, ast.Import):
        names = [alias.name for alias in statement.names]
    else:
        base = statement.module or ""
        if statement.level:
            anchor = importer.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[:len(anchor) - statement.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names = [base] + [f"{base}.{alias.name}" for alias in statement.names]
    found = set()
    for name in names:
        parts = name.split(".")
        # The module itself and every package above it that the importer is not inside of.
        for end in range(1, len(parts) + 1):
            candidate = ".".join(parts[:end])
            inside = importer == candidate or importer.startswith(candidate + ".")
            if candidate in modules and not inside:
                found.add(candidate)
    return found


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the cdc_router modules it imports (with `typing`, for type hints too)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for statement in _imports(tree, typing):
            edges |= _targets(statement, name, path.name == "__init__.py", modules)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_deferred_imports_and_skips_type_checking_ones() -> None:
    graph = import_graph()
    # serde/__init__ imports serde.json inside serializer_for(), settings only for typing.
    assert "cdc_router.serde.json" in graph["cdc_router.serde"]
    assert not any(name.startswith("cdc_router.config") for name in graph["cdc_router.serde"])


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_import_graph_has_no_cycle() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_cycle_goes_through_config_even_with_typing_imports() -> None:
    # config/ is below every other part: its type hints may not point back up either. (Other
    # parts still have typing-only cycles, e.g. debezium <-> serde: fine at run time.)
    found = [c for c in cycles(import_graph(typing=True))
             if any(name.startswith("cdc_router.config") for name in c)]
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
