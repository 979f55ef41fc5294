"""The release number (QA 56-f F-1): 0.1.0 named every build, so README's upgrade notes could
not say which builds they are about. `--version` shows it, and pyproject.toml reads it from
the package, so the two cannot drift apart. 0.3.0 (QA 65-a): 283 commits after 0.2.0 still
called themselves 0.2.0, among them config refusals a user must act on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

from cdc_router import __version__
from cdc_router.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_0_3_0_and_the_cli_shows_it() -> None:
    assert __version__ == "0.3.0"
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output == "cdc-router, version 0.3.0\n"


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "cdc_router.__version__"}


def test_readme_upgrading_section_names_the_versions() -> None:
    readme = (ROOT / "README.md").read_text()
    headings = re.findall(r"^### Upgrading.*$", readme, flags=re.MULTILINE)
    # The newest first, each from the release before it.
    assert headings == [f"### Upgrading from 0.2.0 to {__version__}",
                        "### Upgrading from 0.1.x to 0.2.0"]
