"""How the replay filter (router/replay.py) keeps an id: compact, in runs of one timestamp."""

from __future__ import annotations

from collections.abc import Iterable

from cdc_router.router.lost_commits import Key

# A canonical UUID (lowercase, hyphenated: what Postgres prints for the outbox's uuid id) is
# kept as its 16 bytes, 56 bytes of Python object against 88 for the str.
_UUID_TEXT_LENGTH = 36
# Ids per remembered batch at most: trimming the oldest batch by max_ids deletes from the front
# of its list, so a batch stays short enough for that to be cheap.
BATCH_MAX_IDS = 4096


def compact_key(event_id: str) -> Key:
    """The key the filter keeps for an id: a canonical UUID's 16 bytes, any other str itself.

    Only a string that is exactly `str(uuid)` (lowercase, hyphenated) becomes bytes, so two
    different ids never share a key: an uppercase or braced variant stays a str, and a str is
    never equal to bytes.
    """
    # The hyphens are at 8, 13, 18 and 23: one slice checks them all (the hot path).
    if len(event_id) != _UUID_TEXT_LENGTH or event_id[8:24:5] != "----":
        return event_id
    digits = event_id.replace("-", "")
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        return event_id
    # fromhex also takes uppercase digits and skips whitespace: 16 bytes rule out whitespace,
    # islower() uppercase (and keeps as a str the rare uuid of digits only, which is still exact).
    return raw if len(raw) == 16 and digits.islower() else event_id


def runs_of(entries: Iterable[tuple[str, int]]) -> list[tuple[int, list[Key]]]:
    """(delivered_ms, keys) of consecutive entries of one time, at most BATCH_MAX_IDS each."""
    runs: list[tuple[int, list[Key]]] = []
    for event_id, delivered_ms in entries:
        if not runs or runs[-1][0] != delivered_ms or len(runs[-1][1]) >= BATCH_MAX_IDS:
            runs.append((delivered_ms, []))
        runs[-1][1].append(compact_key(event_id))
    return runs
