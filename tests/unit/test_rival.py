"""kafka/rival.py: who holds a fenced static member's group.instance.id decides (QA 65-a F-3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cdc_router.errors import ConfigError
from cdc_router.kafka.rival import check_rival

OURS = SimpleNamespace(memberid=lambda: "rdkafka-ours")


def test_another_member_under_the_instance_id_is_a_rival_that_stops_this_process() -> None:
    def holder(group: str, instance: str) -> tuple[str, str, str]:
        assert (group, instance) == ("g", "i-1.abc")
        return "rdkafka-theirs", "cdc-router", "/10.0.0.7"

    with pytest.raises(ConfigError, match=r"^field '--instance-id': another process took this "
                       r"instance's group.instance.id 'i-1.abc' in group 'g' \(now member "
                       r"rdkafka-theirs of client 'cdc-router' on /10.0.0.7\)"):
        check_rival(holder, OURS, "g", "i-1.abc", "i-1")


@pytest.mark.parametrize("held", [("rdkafka-ours", "c", "/h"), None])
def test_its_own_member_or_none_listed_is_renewed_as_before(
        held: tuple[str, str, str] | None) -> None:
    check_rival(lambda group, instance: held, OURS, "g", "i-1.abc", "i-1")


def test_a_group_that_does_not_answer_or_no_instance_id_is_no_evidence() -> None:
    def down(group: str, instance: str) -> None:
        raise TimeoutError("no answer")

    check_rival(down, OURS, "g", "i-1.abc", "i-1")
    check_rival(down, OURS, "g", None, "i-1")  # a dynamic member: nothing to take over
    check_rival(lambda g, i: ("x", "c", "/h"), SimpleNamespace(memberid=lambda: None), "g",
                "i-1.abc", "i-1")  # no member id of its own yet: no evidence either
