"""No module of cdc_router imports a private module of another package.

A private module (a name segment after the top-level package that starts with '_', such as
fastavro._validation or confluent_kafka.schema_registry._sync) may change in any release,
without notice; the public names are the contract.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_router"


def private_imports(source: str) -> list[str]:
    """The private modules of other packages that `source` imports, and private names
    imported from another package's modules (`from fastavro.validation import _validate`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("__future__", "cdc_router"):
                continue
            if _private(node.module):
                found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_")]
    return found


def _private(module: str) -> bool:
    top, *rest = module.split(".")
    return top not in ("__future__", "cdc_router") and any(part.startswith("_") for part in rest)


def test_no_module_imports_a_private_module_of_another_package() -> None:
    found = {str(path.relative_to(PACKAGE.parent)): private_imports(path.read_text())
             for path in sorted(PACKAGE.rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}


@pytest.mark.parametrize(("source", "expected"), [
    ("from fastavro.validation import _validate as v", ["fastavro.validation._validate"]),
    ("from fastavro._validation import validate", ["fastavro._validation"]),
    ("import confluent_kafka.schema_registry._sync.avro", [
        "confluent_kafka.schema_registry._sync.avro"]),
    ("from __future__ import annotations", []),
    ("from cdc_router.serde._private import x", []),  # our own package's business
    ("from fastavro.validation import validate\nimport _thread", []),  # top level is allowed
    ("from . import _sibling", []),
])
def test_the_scan_tells_private_from_public(source: str, expected: list[str]) -> None:
    assert private_imports(source) == expected
