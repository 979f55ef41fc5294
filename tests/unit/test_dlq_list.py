"""`dlq list`: what it says when --since or --limit leaves letters out (review 53-c F1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc_router.cli import dlq, main
from cdc_router.dead_letter import dead_letter, dead_letter_headers
from cdc_router.errors import RouteError

CONFIG = ("kafka: {bootstrap_servers: '127.0.0.1:1'}\nsource: {topics: [raw]}\n"
          "routes: [{topic: x}]\ndead_letter: {topic: rv.dlq}\n")
_HOUR_MS = 3_600_000


class _Letter:
    """A consumed dead letter: a timestamp, a partition and an offset, no headers (this
    pipeline's)."""

    def __init__(self, offset: int, timestamp_ms: int, partition: int = 0,
                 headers: list[tuple[str, bytes]] | None = None) -> None:
        self._offset, self._timestamp_ms, self._partition = offset, timestamp_ms, partition
        self._headers = headers or []

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 1, self._timestamp_ms

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


def _reader(letters: list[_Letter]) -> type:
    class _Reader:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def read_to_end(self, **kwargs: Any) -> Any:
            return iter(letters)

        def close(self) -> None:
            pass

    return _Reader


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(dlq, "_replayed_line", lambda config: None)
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG, "utf-8")
    return path


def test_since_after_every_letter_says_how_many_are_on_the_topic(
        config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 53-c F1: "no dead letters on rv53c.dlq" while 3 were on it.
    monkeypatch.setattr(dlq, "TopicReader", _reader([_Letter(n, 1_000 + n) for n in range(3)]))
    listed = CliRunner().invoke(main, ["dlq", "list", "-c", str(config),
                                       "--since", "2099-01-01"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == "no dead letters since 2099-01-01T00:00Z (3 on rv.dlq)\n"
    empty = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "--since", "1h"])
    assert empty.exit_code == 0, empty.output
    assert empty.stdout.startswith("no dead letters since 20")
    monkeypatch.setattr(dlq, "TopicReader", _reader([]))
    none = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "--since", "1h"])
    assert none.stdout == "no dead letters on rv.dlq\n"


@pytest.mark.parametrize("newest, offsets", [(False, [0]), (True, [2])])
def test_a_list_cut_by_the_limit_says_of_how_many(
        config: Path, monkeypatch: pytest.MonkeyPatch, newest: bool, offsets: list[int]) -> None:
    # Review 53-c F1: `-n 1` showed 1 of 3, and nothing said more existed.
    monkeypatch.setattr(dlq, "TopicReader", _reader([_Letter(n, 1_000 + n) for n in range(3)]))
    listed = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "-n", "1", "-o", "json"]
                                + (["--newest"] if newest else []))
    assert listed.exit_code == 0, listed.output
    assert f'"offset": {offsets[0]}' in listed.stdout
    assert f"1 of 3 shown (the {'newest' if newest else 'oldest'}; -n sets how many)" \
        in listed.stderr
    whole = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "-n", "3"])
    assert "shown" not in whole.stderr


def test_each_letter_is_named_by_its_partition_and_offset(
        config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 62-b: on a dead-letter topic of 3 partitions, 1,012 of 3,016 letters shared their
    # offset with another partition's, and the list showed the offset alone.
    monkeypatch.setattr(dlq, "TopicReader", _reader(
        [_Letter(5, 1_000, partition=0), _Letter(5, 1_001, partition=2)]))
    as_json = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert [(row["partition"], row["offset"]) for row in json.loads(as_json.stdout)] == [
        (0, 5), (2, 5)]
    as_text = CliRunner().invoke(main, ["dlq", "list", "-c", str(config)])
    assert as_text.exit_code == 0, as_text.output
    header, first, second = as_text.stdout.splitlines()
    assert header.split()[0] == "letter", "named as `dlq replay` names a letter"
    assert (first.split()[0], second.split()[0]) == ("0@5", "2@5")


@pytest.mark.parametrize("newest, written", [(False, [1, 2, 3]), (True, [7, 8, 9])])
def test_the_oldest_and_the_newest_are_so_across_partitions(
        config: Path, monkeypatch: pytest.MonkeyPatch, newest: bool, written: list[int]) -> None:
    # QA 62-b: the reader hands the letters partition after partition; on 3 partitions
    # `--newest -n 200` showed 65 of the 200 newest (the last partition read's tail), and the
    # first 3 were partition 0's, not the 3 oldest.
    read_order = [_Letter(offset, 1_000 * (3 * offset + partition + 1), partition)
                  for partition in range(3) for offset in range(3)]
    monkeypatch.setattr(dlq, "TopicReader", _reader(read_order))
    listed = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "-n", "3", "-o", "json"]
                                + (["--newest"] if newest else []))
    assert listed.exit_code == 0, listed.output
    shown = [(row["partition"], row["offset"]) for row in json.loads(listed.stdout)]
    assert shown == [((n - 1) % 3, (n - 1) // 3) for n in written], "oldest first, as written"
    assert f"3 of 9 shown (the {'newest' if newest else 'oldest'}" in listed.stderr


def test_an_idempotent_consumers_letters_are_not_called_other_pipelines(
        config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Review 63: a consumer's letters on a shared dead-letter topic (its source: a destination
    # topic) were counted as "letters of other pipelines".
    theirs = dead_letter(topic="billing.public.outbox", partition=0, offset=7, key=None,
                         value=b"{}", original_headers=[], stage="route",
                         error=RouteError("no route"), group="billing").headers
    consumer = dead_letter_headers(topic="x", partition=0, offset=3, stage="handle",
                                   error=ValueError("boom"), attempts=5)
    letters = [_Letter(0, 1_000), _Letter(1, 1_001, headers=list(theirs)),
               _Letter(2, 1_002, headers=consumer), _Letter(3, 1_003, headers=consumer)]
    monkeypatch.setattr(dlq, "TopicReader", _reader(letters))
    listed = CliRunner().invoke(main, ["dlq", "list", "-c", str(config), "-o", "json"])
    assert listed.exit_code == 0, listed.output
    assert [row["offset"] for row in json.loads(listed.stdout)] == [0]
    assert listed.stderr == ("1 letter of other pipelines and 2 of idempotent consumers left "
                             "out (--all lists them)\n")
    monkeypatch.setattr(dlq, "TopicReader", _reader(letters[2:]))
    alone = CliRunner().invoke(main, ["dlq", "list", "-c", str(config)])
    assert alone.stdout == "no dead letters of this pipeline on rv.dlq\n"
    assert alone.stderr == "2 letters of idempotent consumers left out (--all lists them)\n"
