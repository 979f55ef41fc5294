"""Which producer failures the router and the relay renew the producer for (router/renewal.py)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError, MemberFenced
from cdc_router.router.renewal import ProducerRenewal


def _fatal(code: int) -> FatalKafkaError:
    return FatalKafkaError("failed for good", code=code)


def test_a_fence_and_the_fatal_state_after_it_are_renewed_once_until_a_commit() -> None:
    for code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError._FATAL,
                 KafkaError.INVALID_TXN_STATE):
        renewal = ProducerRenewal()
        assert renewal.allows(_fatal(code))
        assert not renewal.allows(_fatal(code)), "a second one before a commit stops"
        renewal.committed()
        assert renewal.allows(_fatal(code))


def test_credentials_and_a_fenced_static_member_are_never_renewed() -> None:
    renewal = ProducerRenewal()
    assert not renewal.allows(_fatal(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    assert not renewal.allows(MemberFenced("Static consumer fenced"))
    assert not renewal.allows(FatalKafkaError("no code"))
    assert renewal.allows(_fatal(KafkaError._FENCED)), "nothing above spent the renewal"
