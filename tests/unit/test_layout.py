"""The package's shape: small modules, grouped by the part of the system they serve."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "cdc_router"
MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    long = {str(path.relative_to(PACKAGE)): count for path in PACKAGE.rglob("*.py")
            if (count := len(path.read_text("utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def test_the_top_level_holds_only_the_parts_and_what_they_share() -> None:
    """Router side, consumer side and operator tooling are folders; the rest is shared."""
    modules = {path.name for path in PACKAGE.glob("*.py")}
    assert modules == {"__init__.py", "__main__.py", "errors.py", "dead_letter.py",
                       "postgres.py", "signals.py"}
