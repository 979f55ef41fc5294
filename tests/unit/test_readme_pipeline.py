"""README against what a team meets on its first day (QA 55-a)."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10}


def test_the_pipeline_headings_count_is_the_commands_it_shows() -> None:
    # QA 55-a F-6: "The pipeline in five commands" showed eight command lines.
    heading, block = re.search(r"^## (The pipeline\b[^\n]*)\n+```sh\n(.*?)```", README,
                               re.MULTILINE | re.DOTALL).groups()  # type: ignore[union-attr]
    commands = [line for line in block.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) >= 5
    said = [NUMBERS[word] for word in re.findall(r"\w+", heading.lower()) if word in NUMBERS]
    assert said in ([], [len(commands)]), (heading, len(commands))


def test_the_warning_a_restart_after_kill_9_logs_is_explained() -> None:
    # QA 55-a F-8: every restart after a kill -9 logged "Failed to acquire transactional PID"
    # at WARNING, and README explained it only in the benchmark notes.
    guarantees = README[README.index("## Guarantees"):README.index("\n## ", README.index(
        "## Guarantees") + 3)]
    said = re.sub(r"\s+", " ", guarantees)
    assert "`Failed to acquire transactional PID ... another concurrent operation on the " \
           "same transaction was ongoing: retrying`" in said
    assert "It is harmless" in said
