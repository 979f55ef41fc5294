"""quick_init: a frozen dataclass keeps every behaviour, only its __init__ is faster."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, dataclass, field, replace

import pytest

from cdc_router.router.debezium import OutboxEvent
from cdc_router.router.values import quick_init


@quick_init
@dataclass(frozen=True)
class _Quick:
    name: str
    count: int = 3
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Plain:
    name: str
    count: int = 3
    tags: tuple[str, ...] = ()


def test_a_quick_instance_behaves_as_the_plain_frozen_dataclass() -> None:
    for args, kwargs in ((("a",), {}), (("a", 5), {"tags": ("x",)}), ((), {"name": "b"})):
        quick, plain = _Quick(*args, **kwargs), _Plain(*args, **kwargs)  # type: ignore[arg-type]
        assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
        assert repr(quick) == repr(plain).replace("_Plain", "_Quick")
        assert quick == _Quick(*args, **kwargs) and hash(quick) == hash(_Quick(*args, **kwargs))
    quick = _Quick("a")
    with pytest.raises(FrozenInstanceError):
        quick.count = 4  # type: ignore[misc]
    assert replace(quick, count=9) == _Quick("a", 9)
    with pytest.raises(TypeError):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick("a", 1, (), 4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick("a", nope=1)  # type: ignore[call-arg]


def test_per_record_values_stay_frozen() -> None:
    event = OutboxEvent("id", "Order", "1", "OrderPaid", b"{}", True, (), None, "c", None, None)
    with pytest.raises(FrozenInstanceError):
        event.type = "x"  # type: ignore[misc]
    assert event.extra_columns == ()


def test_only_frozen_dataclasses_with_plain_defaults_are_taken() -> None:
    @dataclass
    class Mutable:
        name: str

    @dataclass(frozen=True)
    class Factory:
        tags: list[str] = field(default_factory=list)

    for cls in (Mutable, Factory, str):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)
