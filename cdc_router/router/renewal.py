"""When a producer that failed for good is replaced in-process instead of stopping the router.

librdkafka makes some errors of the producer's own transaction fatal although nothing outside
the process is wrong: a destination topic deleted under an open transaction fails its records
by timeout, and the abort that follows is refused with INVALID_TXN_STATE (measured on Kafka
4.x); an idempotence sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER; a transaction that stayed
open past transaction.timeout.ms is aborted by its coordinator, which bumps the producer's
epoch, and the next commit or abort is fenced (_FENCED, measured on Kafka 4.3 with a bare
producer; QA saw a router exit so while a JetStream stream kept refusing its batches). Kafka
Streams replaces its producer for such errors, a fence included (it rejoins the group); so
does the router: a new producer (same transactional id, whose init_transactions fences the old
epoch and ends its transaction), the batch forgotten and re-read from the committed offsets
(the relay: from the position topic, and only while it holds its table's lock). Offsets still
commit only with the group's metadata (KIP-447), so a second process with the same
--instance-id is refused by the group, which fences the older one's static member
(FENCED_INSTANCE_ID: exit 75). The new producer's init_transactions is retried with the loop's
backoff until the cluster answers (Transaction.renew leaves it to the caller).

The budget: INVALID_TXN_STATE and OUT_OF_ORDER_SEQUENCE_NUMBER once until a batch commits
again, so that a cluster that keeps refusing is never retried in a loop. Fences (and _FATAL,
which is how a producer already fenced refuses its next produce) at most MAX_RENEWALS times in
RENEWAL_WINDOW_S (kafka/budget.py), commits or not: two processes starting with one
--instance-id fence each other a few times before the group settles it, while a rival that
keeps taking the transactional id (two pipelines sharing delivery.transactional_id on one host)
stops the process, loudly. A refusal of credentials is never renewed (one raised on librdkafka's
thread shows as _FATAL: the renewed producer's init then fails on the refusal itself, and the
process stops).

The consumer's static member fenced by the group (MemberFenced) is renewed too, by a new consumer
with the same group.instance.id, at most MAX_RENEWALS times in RENEWAL_WINDOW_S. QA 36-a: on a
3-broker cluster every move of the group coordinator (a broker killed or restarted) outlasted
session.timeout.ms; librdkafka rejoined the static member, and the request it still had in flight
with the old member id was fenced (_FATAL): every instance exited 75, and the stream stopped
without a supervisor. Two processes given one --instance-id: the older one's member fenced by the
newer's join stops for good instead (kafka/rival.py, QA 65-a F-3: they fenced each other in
turn until a budget ran out, the one left a race).

A producer whose send_offsets_to_transaction blocked past its timeout (ProducerHung, librdkafka
#5456/#5511: QA 37-a saw it end 5 of 10 instances at coordinator moves on a 3-broker cluster,
43-127 s without delivery) is given up and renewed too, at most MAX_RENEWALS times in
RENEWAL_WINDOW_S: each leaves a client and a thread blocked until its call returns (QA 38-a
saw every one return), which a process restart frees; so also only while at most MAX_RENEWALS are
still blocked, however long ago they were given up (review 38 F3).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError, MemberFenced, ProducerHung, ProducerLost
from cdc_router.kafka.budget import (
    MAX_RENEWALS,
    RENEWAL_WINDOW_S,
    RenewalBudget,
    unblocked_enough,
)
from cdc_router.kafka.errors import describe, kafka_error_of
from cdc_router.kafka.watchdog import blocked_calls

log = logging.getLogger("cdc_router.router")

# Only what was measured, or is librdkafka's documented idempotence dead end.
RENEWABLE_ONCE = frozenset({KafkaError.INVALID_TXN_STATE, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER})
# A fence of this transactional id; _FATAL is how a producer in its fatal state refuses the next
# produce() ("Unable to produce message: Local: Fatal error", measured after a fence raised on
# librdkafka's thread). The consumer's _FATAL is MemberFenced: a new consumer, its own budget.
FENCES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                    KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FATAL})
# Every this many batches aborted in a row for the cluster's fault, the producer is renewed too
# (about 30 s of backoff in, then every 3 min): QA 37-b, after the controller fenced the only
# broker for 4.5 s, the producer never had metadata again ("Failed to get metadata: Local:
# Broker transport failure", librdkafka #5301: a broker left out of metadata is dropped) while
# Kafka answered every new client; the router backed off for ever. A real outage costs only
# a new client whose init_transactions waits for the cluster.
RENEW_AFTER_ABORTS = 6


class ProducerRenewal:
    """allows(failure): whether to replace the producer for it; committed() re-arms the
    once-until-commit budget (the fences' budget is a time window)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 blocked: Callable[[], int] = blocked_calls) -> None:
        self._blocked = blocked
        self._spent = False
        self._fences = RenewalBudget(clock)
        self._member_fences = RenewalBudget(clock)
        self._hangs = RenewalBudget(clock)

    def allows(self, failure: FatalKafkaError) -> bool:
        if isinstance(failure, MemberFenced):  # a new consumer (OutboxRouter), not a producer
            # whose predecessor's close may be given up too (kafka/closing.py close_aside)
            return unblocked_enough(self._blocked) and self._within_budget(self._member_fences)
        if isinstance(failure, ProducerHung):
            return unblocked_enough(self._blocked) and self._within_budget(self._hangs)
        if failure.code in FENCES:
            return self._within_budget(self._fences)
        if self._spent or failure.code not in RENEWABLE_ONCE:
            return False
        self._spent = True
        return True

    @staticmethod
    def _within_budget(budget: RenewalBudget) -> bool:
        if budget.spend():
            return True
        log.error("event=renewal_budget_spent: replaced %d times in the last %.0f s already "
                  "(each a broker outage or coordinator move, or a rival process); this one "
                  "ends the process", MAX_RENEWALS, RENEWAL_WINDOW_S)
        return False

    def committed(self) -> None:
        self._spent = False


def producer_lost(failure: FatalKafkaError, committed: int) -> ProducerLost | None:
    """The end of a one-off command (`dlq replay`) when its producer failed for good on its
    own, as `run` tells it (RENEWABLE_ONCE: QA 52-b L1, a Kafka restart mid-apply, then the
    abort refused with INVALID_TXN_STATE), which `run` replaces: exit 75, run it again; else
    None (a fence: another run took over). `committed`: the records committed before."""
    if type(failure) is not FatalKafkaError or failure.code not in RENEWABLE_ONCE:
        return None
    error = kafka_error_of(failure.__cause__) if failure.__cause__ is not None else None
    said = describe(error) if error is not None else str(failure)
    return ProducerLost("dlq replay stopped: its producer's transaction can no longer end "
                        f"({said}), as after a broker restart; {committed} letters were "
                        "committed before; run it again (what was delivered is skipped)",
                        code=failure.code)
