"""The demo finds a destination record's event id by its `id` header, whatever the route keys
by, and hands fulfillment the payment's record (reread 50-i F3)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cdc_router.examples import fulfillment
from cdc_router.local import demo

EVENT_ID = "01a247a0-f6dd-7000-8000-000000000001"


class _Record:
    def __init__(self, topic: str, key: bytes, event_id: str, partition: int = 0,
                 offset: int = 0) -> None:
        self._topic, self._key, self._id = topic, key, event_id
        self._partition, self._offset = partition, offset

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return b"{}"

    def headers(self) -> list[tuple[str, bytes]]:
        return [("id", self._id.encode())]

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


class _Conn:
    def __init__(self, queried: list[str]) -> None:
        self.queried = queried

    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, query: str, params: tuple[str]) -> Any:
        self.queried.append(params[0])
        count = 1 if params[0] == EVENT_ID else 0  # the consumer dedups on the id header
        return SimpleNamespace(fetchone=lambda: (count,))


class _Fulfillment:
    stats = SimpleNamespace(duplicates=2)

    def run(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_fulfillment_counts_the_shipments_of_the_records_event_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A payments route with `key: aggregate_id`: the record's key is pay-42, its event id the
    # id header. The demo polled for pay-42 until its deadline and said 0 shipments.
    queried: list[str] = []
    monkeypatch.setattr(demo, "Producer", lambda *a: SimpleNamespace(
        produce=lambda *a, **k: None, flush=lambda timeout: 0))
    monkeypatch.setattr(demo.clients, "logged_config", lambda config: {})
    monkeypatch.setattr(fulfillment, "build", lambda args: _Fulfillment())
    monkeypatch.setattr(demo.psycopg, "connect", lambda *a, **k: _Conn(queried))
    monkeypatch.setattr(demo, "_ROUTED_TIMEOUT_S", 1.0)
    config = SimpleNamespace(kafka=SimpleNamespace(bootstrap_servers="127.0.0.1:1"),
                             dead_letter=SimpleNamespace(topic="dlq"))
    said: list[str] = []

    count = demo.run_fulfillment(config, "postgresql://",  # type: ignore[arg-type]
                                 _Record("payments", b"pay-42", EVENT_ID),  # type: ignore[arg-type]
                                 said.append)

    assert count == 1 and set(queried) == {EVENT_ID}
    assert said[-1].startswith(f"fulfillment: 1 shipment for event {EVENT_ID}")


def test_the_routed_records_come_in_the_samples_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Both samples routed to one topic, in other partitions: sorted by (topic, offset), the
    # last record could be the order's, and fulfillment was handed it as the payment.
    payment = _Record("events", b"pay-7", "id-payment", partition=1, offset=0)
    order = _Record("events", b"7", "id-order", partition=0, offset=5)
    polled = [payment, order]

    class _Consumer:
        def __init__(self, config: dict[str, Any]) -> None:
            pass

        def subscribe(self, topics: list[str]) -> None:
            pass

        def poll(self, timeout: float) -> _Record | None:
            return polled.pop(0) if polled else None

        def close(self) -> None:
            pass

    monkeypatch.setattr(demo, "Consumer", _Consumer)
    monkeypatch.setattr(demo.clients, "logged_config", lambda config: {})
    config = SimpleNamespace(dead_letter=SimpleNamespace(topic="dlq"))
    router = SimpleNamespace(is_alive=lambda: True)

    records = demo._read_routed(config,  # type: ignore[arg-type]
                                {"id-order": "events", "id-payment": "events"},
                                router)  # type: ignore[arg-type]

    assert [demo.event_id_of(r) for r in records] == ["id-order", "id-payment"]
