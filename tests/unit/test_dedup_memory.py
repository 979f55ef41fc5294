"""MemoryDedupStore: exact within one process."""

from __future__ import annotations

import threading

import pytest

from cdc_router.consumer.dedup import DedupKey, MemoryDedupStore, Outcome


def test_first_run_is_done_then_duplicate() -> None:
    store = MemoryDedupStore()
    effects: list[str] = []
    key = DedupKey("fulfillment", "e1")
    assert store.run_once(key, lambda _: effects.append("e1")) is Outcome.DONE
    assert store.run_once(key, lambda _: effects.append("e1")) is Outcome.DUPLICATE
    assert effects == ["e1"]


def test_groups_are_independent() -> None:
    store = MemoryDedupStore()
    effects: list[str] = []
    for group in ("fulfillment", "billing"):
        assert store.run_once(DedupKey(group, "e1"), lambda _, g=group: effects.append(g)) \
            is Outcome.DONE
    assert effects == ["fulfillment", "billing"]


def test_a_raising_effect_leaves_the_key_not_done() -> None:
    store = MemoryDedupStore()
    key = DedupKey("g", "e1")

    def fail(_: None) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.run_once(key, fail)
    assert not store.is_done(key)
    assert store.run_once(key, lambda _: None) is Outcome.DONE


def test_concurrent_duplicates_run_the_effect_once() -> None:
    store = MemoryDedupStore()
    effects: list[int] = []
    key = DedupKey("g", "same")
    threads = [threading.Thread(target=store.run_once, args=(key, lambda _, i=i: effects.append(i)))
               for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(effects) == 1


def test_empty_key_parts_are_rejected() -> None:
    with pytest.raises(ValueError):
        DedupKey("", "e1")
    with pytest.raises(ValueError):
        DedupKey("g", "")
