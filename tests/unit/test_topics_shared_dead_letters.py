"""`topics apply` of one pipeline that deletes a shared dead-letter topic's records sooner
(QA 63-b F-4: one team's dead_letter.config lowered the shared topic's retention.ms from 7
days to an hour without a word; the other teams' 146 letters would have gone with it)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_router.cli import topics as topics_cli
from cdc_router.config.model import RouterConfig
from cdc_router.ops.report import DeadLetterState
from cdc_router.router.topics import TopicPlan, retention_cuts


def _config() -> RouterConfig:
    return RouterConfig.model_validate({
        "source": {"topics": ["billing.public.outbox"], "group_id": "team-billing"},
        "routes": [{"topic": "billing.events"}],
        "dead_letter": {"config": {"retention.ms": "3600000"}}})


def _plan(changes: dict[str, tuple[str | None, str]], name: str = "cdc-router.dlq"
          ) -> TopicPlan:
    return TopicPlan(name, "update", None, None, changes)


@pytest.mark.parametrize(("old", "new", "cut"), [
    ("604800000", "3600000", True), ("-1", "3600000", True), ("3600000", "604800000", False),
    ("3600000", "-1", False), (None, "3600000", False), ("x", "1", False)])
def test_a_retention_cut_is_a_lower_time_or_size(old: str | None, new: str, cut: bool) -> None:
    assert bool(retention_cuts(_plan({"retention.ms": (old, new)}))) is cut
    assert bool(retention_cuts(_plan({"retention.bytes": (old, new)}))) is cut


class _Admin:
    admin = object()


def _scanned(monkeypatch: pytest.MonkeyPatch, others: int) -> list[str]:
    asked: list[str] = []

    def state(admin: Any, kafka: Any, topic: str, now_ms: int, ours: Any) -> DeadLetterState:
        asked.append(topic)
        return DeadLetterState(topic=topic, count=0, others=others)
    monkeypatch.setattr(topics_cli, "dead_letter_state", state)
    monkeypatch.setattr(topics_cli.clients, "logged_config", lambda config: {})
    return asked


def test_a_cut_of_a_dead_letter_topic_holding_others_letters_is_warned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _scanned(monkeypatch, 146)
    plan = topics_cli._others_letters(_plan({"retention.ms": ("604800000", "3600000")}),
                                      _config(), _Admin())  # type: ignore[arg-type]
    assert plan.warnings == (
        "retention.ms 604800000 -> 3600000 deletes sooner the 146 letters of other pipelines "
        "on it too (`dlq list --all`): agree it with them, or give this pipeline its own "
        "dead_letter.topic",)


def test_no_warning_without_others_letters_or_a_cut_and_no_read_without_a_cut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _scanned(monkeypatch, 0)
    cut = _plan({"retention.ms": ("604800000", "3600000")})
    assert topics_cli._others_letters(cut, _config(), _Admin()).warnings == ()  # type: ignore[arg-type]
    asked = _scanned(monkeypatch, 5)
    raised = _plan({"retention.ms": ("3600000", "604800000")})
    other_topic = _plan({"retention.ms": ("604800000", "3600000")}, name="billing.events")
    for plan in (raised, other_topic):
        assert topics_cli._others_letters(plan, _config(), _Admin()).warnings == ()  # type: ignore[arg-type]
    assert asked == []
