"""README's first pipeline section: the count its heading gives is the count it shows."""

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
