"""Dead letters keep the raw record and say where it came from and why."""

from __future__ import annotations

from cdc_router.dead_letter import dead_letter
from cdc_router.errors import DecodeError


def test_dead_letter_keeps_key_value_and_headers_and_adds_the_reason():
    letter = dead_letter(topic="outbox.public.outbox", partition=2, offset=41, key=b"k",
                         value=b"{bad", original_headers=[("trace", b"t1")], stage="decode",
                         error=DecodeError("not JSON at byte 1"), event_id=None)
    headers = dict(letter.headers)
    assert (letter.key, letter.value) == (b"k", b"{bad")
    assert headers["trace"] == b"t1"
    assert headers["dlq.source.topic"] == b"outbox.public.outbox"
    assert headers["dlq.source.partition"] == b"2"
    assert headers["dlq.source.offset"] == b"41"
    assert headers["dlq.stage"] == b"decode"
    assert headers["dlq.error.class"] == b"DecodeError"
    assert headers["dlq.error.message"] == b"not JSON at byte 1"
    assert "dlq.event.id" not in headers


def test_a_huge_reason_is_cut():
    letter = dead_letter(topic="t", partition=0, offset=0, key=None, value=None,
                         original_headers=None, stage="route", error=ValueError("x" * 10_000),
                         event_id="e1")
    headers = dict(letter.headers)
    assert len(headers["dlq.error.message"]) == 2000
    assert headers["dlq.event.id"] == b"e1"
