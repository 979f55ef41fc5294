"""NATS subject filters compared: a match, a cover, a collision (`*` one token, a final `>`
one or more)."""

from __future__ import annotations


def subject_matches(filter_: str, subject: str) -> bool:
    """NATS's match: `*` is one token, a final `>` one or more."""
    wanted, tokens = filter_.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or (token != "*" and token != tokens[index]):
            return False
    return len(tokens) == len(wanted)


def subject_covers(wide: str, narrow: str) -> bool:
    """Whether every subject that `narrow` (wildcards allowed) matches, `wide` matches too."""
    if narrow.split(".")[-1] == ">":  # any number of tokens: only a `>` of `wide` takes them
        return wide.split(".")[-1] == ">" and subject_matches(wide, narrow)
    return subject_matches(wide, narrow)


def subjects_collide(first: str, second: str) -> bool:
    """Whether some subject matches both filters (`*` and a final `>` in either)."""
    one, other = first.split("."), second.split(".")
    for index in range(max(len(one), len(other))):
        if index >= len(one) or index >= len(other):
            return False
        if ">" in (one[index], other[index]):
            return True
        if one[index] != other[index] and "*" not in (one[index], other[index]):
            return False
    return True
