"""When a producer that failed for good is replaced in-process instead of stopping the router.

librdkafka makes some errors of the producer's own transaction fatal although nothing outside
the process is wrong: a destination topic deleted under an open transaction fails its records
by timeout, and the abort that follows is refused with INVALID_TXN_STATE (measured on Kafka
4.x); an idempotence sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER; a transaction that stayed
open past transaction.timeout.ms is aborted by its coordinator, which bumps the producer's
epoch, and the next commit or abort is fenced (_FENCED, measured on Kafka 4.3 with a bare
producer; QA saw a router exit so while a JetStream stream kept refusing its batches). Kafka
Streams replaces its producer for such errors, a fence included (it rejoins the group: a real
second instance is fenced by the group, KIP-447); so does the router: a new producer (same
transactional id, whose init_transactions fences the old epoch and ends its transaction), the
batch forgotten and re-read from the committed offsets (the relay: from the position topic,
and only while it holds its table's lock). Offsets still commit only with the group's
metadata, so a real second instance with the same --instance-id is refused by the group
(FENCED_INSTANCE_ID stops it with exit 75). The new producer's init_transactions is retried
with the loop's backoff until the cluster answers (Transaction.renew leaves it to the
caller). Never for a refusal of credentials. And once only until a batch commits again: a
second such error before any commit stops the router, so that a cluster that keeps refusing,
or two processes that keep fencing each other's producer, are never retried in a loop.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError, MemberFenced

# Only what was measured, or is librdkafka's documented idempotence dead end, or a fence of
# this transactional id (our own timed-out transaction, or a second instance: see above).
# _FATAL is how a producer already in its fatal state refuses the next produce() ("Unable to
# produce message: Local: Fatal error", measured after a fence raised on librdkafka's thread);
# the consumer's _FATAL is a fenced static member, MemberFenced, which is never renewed.
RENEWABLE = frozenset({
    KafkaError.INVALID_TXN_STATE,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError._FATAL,
})


class ProducerRenewal:
    """allows(failure): whether to replace the producer for it; committed() re-arms it."""

    def __init__(self) -> None:
        self._spent = False

    def allows(self, failure: FatalKafkaError) -> bool:
        if self._spent or failure.code not in RENEWABLE or isinstance(failure, MemberFenced):
            return False
        self._spent = True
        return True

    def committed(self) -> None:
        self._spent = False
