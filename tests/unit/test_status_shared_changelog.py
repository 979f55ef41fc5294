"""`status` on a dedup changelog other pipelines write marks to (QA 63-b L-2: its size, every
pipeline's, was said as this pipeline's without a word)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc_router.cli._status_text import as_json, as_text
from cdc_router.ops.report import ChangelogState
from cdc_router.ops.verdict import judge
from tests.unit.test_status_verdict import SETTINGS, healthy


def _shown(changelog: ChangelogState) -> tuple[str, object]:
    report = replace(healthy(), dedup_changelog=changelog)
    problems = judge(report, SETTINGS)
    line = next(line for line in as_text(report, problems).splitlines()
                if line.startswith("dedup changelog"))
    return line, as_json(report, problems)["dedup_changelog"]["other_groups"]


@pytest.mark.parametrize("others, said", [
    (("billing",), ", every pipeline's: shared with group billing (among its newest marks; "
                   "each pipeline reads only its own group's)"),
    (("billing", "shipping"), ", every pipeline's: shared with groups billing, shipping "),
])
def test_the_other_groups_writing_marks_there_are_named(others: tuple[str, ...],
                                                        said: str) -> None:
    line, listed = _shown(ChangelogState(topic="cdc-router.dedup", partitions=1,
                                         retained_offsets=7758, other_groups=others))
    assert line.startswith("dedup changelog cdc-router.dedup: 7758 offsets retained in 1 "
                           f"partition{said}"), line
    assert listed == others


@pytest.mark.parametrize("others", [(), None])  # none found; not read (no Read on the topic)
def test_a_changelog_of_this_pipeline_alone_or_not_read_keeps_its_line(
        others: tuple[str, ...] | None) -> None:
    line, listed = _shown(ChangelogState(topic="cdc-router.dedup", partitions=2,
                                         retained_offsets=12, other_groups=others))
    assert line == "dedup changelog cdc-router.dedup: 12 offsets retained in 2 partitions"
    assert listed == others
