"""Which producer failures the router and the relay renew the producer for (router/renewal.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError, MemberFenced, ProducerHung
from cdc_router.kafka.budget import MAX_RENEWALS, RENEWAL_WINDOW_S, RenewalBudget
from cdc_router.router.renewal import ProducerRenewal


def _fatal(code: int) -> FatalKafkaError:
    return FatalKafkaError("failed for good", code=code)


def test_a_refused_abort_or_a_sequence_gap_is_renewed_once_until_a_commit() -> None:
    for code in (KafkaError.INVALID_TXN_STATE, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER):
        renewal = ProducerRenewal()
        assert renewal.allows(_fatal(code))
        assert not renewal.allows(_fatal(code)), "a second one before a commit stops"
        renewal.committed()
        assert renewal.allows(_fatal(code))


def test_fences_are_renewed_a_few_times_in_a_window_commits_or_not() -> None:
    # Review, session 29: two processes with one --instance-id fence each other a few times
    # before the group settles it; a rival that keeps taking the id must stop the process,
    # although each of them commits in between.
    now = [0.0]
    renewal = ProducerRenewal(clock=lambda: now[0])
    for code in (KafkaError._FENCED, KafkaError._FATAL, KafkaError.PRODUCER_FENCED)[:MAX_RENEWALS]:
        assert renewal.allows(_fatal(code))
        renewal.committed()
        now[0] += 10
    assert not renewal.allows(_fatal(KafkaError._FENCED))
    now[0] += RENEWAL_WINDOW_S
    assert renewal.allows(_fatal(KafkaError._FENCED)), "the window moved on"


def test_a_fenced_static_member_is_renewed_three_times_in_its_window_apart_from_fences() -> None:
    # QA 36-a: every move of the group coordinator fenced every instance's static member.
    now = [0.0]
    renewal = ProducerRenewal(clock=lambda: now[0])
    for _ in range(MAX_RENEWALS):
        assert renewal.allows(MemberFenced("Static consumer fenced"))
        now[0] += 10
    assert not renewal.allows(MemberFenced("Static consumer fenced")), "a rival instance"
    assert renewal.allows(_fatal(KafkaError._FENCED)), "the producer's budget is its own"
    now[0] += RENEWAL_WINDOW_S
    assert renewal.allows(MemberFenced("Static consumer fenced")), "the window moved on"


def test_credentials_are_never_renewed() -> None:
    renewal = ProducerRenewal()
    assert not renewal.allows(_fatal(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    assert not renewal.allows(FatalKafkaError("no code"))
    assert renewal.allows(_fatal(KafkaError.INVALID_TXN_STATE)), "nothing above spent it"


def test_a_hung_producer_is_renewed_three_times_in_its_window_apart_from_fences() -> None:
    # Each hung producer leaves a client blocked in its thread: a few, then a restart frees them.
    now = [0.0]
    renewal = ProducerRenewal(clock=lambda: now[0], blocked=lambda: 1)
    for _ in range(MAX_RENEWALS):
        assert renewal.allows(ProducerHung("blocked"))
        renewal.committed()
        now[0] += 10
    assert not renewal.allows(ProducerHung("blocked"))
    assert renewal.allows(_fatal(KafkaError._FENCED)), "the fences' budget is their own"
    now[0] += RENEWAL_WINDOW_S
    assert renewal.allows(ProducerHung("blocked")), "the window moved on"


def test_a_hung_producer_is_not_renewed_while_more_than_three_given_up_calls_are_blocked(
        caplog: pytest.LogCaptureFixture) -> None:
    # Review 38 F3: the window caps the rate only; calls that never returned would pile up,
    # each holding a client's threads and sockets, over weeks of coordinator moves.
    blocked = [MAX_RENEWALS]  # this hang's included
    renewal = ProducerRenewal(clock=lambda: 0.0, blocked=lambda: blocked[0])
    assert renewal.allows(ProducerHung("blocked"))
    blocked[0] = MAX_RENEWALS + 1
    assert not renewal.allows(ProducerHung("blocked"))
    assert "event=renewal_budget_spent blocked_calls=4" in caplog.text
    assert renewal.allows(_fatal(KafkaError._FENCED)), "not the fences' budget"


def test_a_renewal_budget_counts_spends_in_a_moving_window() -> None:
    now = [0.0]
    budget = RenewalBudget(clock=lambda: now[0])
    for _ in range(MAX_RENEWALS):
        assert budget.spend()
        now[0] += 1
    assert not budget.spend(), "spent"
    assert not budget.spend(), "a refusal is not counted as a spend, nor does it free one"
    now[0] = RENEWAL_WINDOW_S + 0.5  # past the first spend's window only
    assert budget.spend()
    assert not budget.spend()


def test_a_fenced_member_is_not_renewed_while_more_than_three_given_up_calls_block() -> None:
    # Review 41-2 N5: its predecessor's close may be one of them (kafka/closing.py).
    blocked = [MAX_RENEWALS]
    renewal = ProducerRenewal(clock=lambda: 0.0, blocked=lambda: blocked[0])
    assert renewal.allows(MemberFenced("Static consumer fenced"))
    blocked[0] = MAX_RENEWALS + 1
    assert not renewal.allows(MemberFenced("Static consumer fenced"))
