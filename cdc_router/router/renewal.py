"""When a producer that failed for good is replaced in-process instead of stopping the router.

librdkafka makes some errors of the producer's own transaction fatal although nothing outside
the process is wrong: a destination topic deleted under an open transaction fails its records
by timeout, and the abort that follows is refused with INVALID_TXN_STATE (measured on Kafka
4.x); an idempotence sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER. Kafka Streams replaces its
producer for such errors; so does the router: a new producer (same transactional id, whose
init_transactions fences the old epoch and ends its transaction), the batch forgotten and
re-read from the committed offsets (the relay: from the position topic). The new producer's
init_transactions is retried with the loop's backoff until the cluster answers
(Transaction.renew leaves it to the caller). Never for a fence (another instance with the same
id) or a refusal of credentials: those stop the router. And once only until a batch commits
again: a second such error before any commit stops the router, so that a cluster that keeps
refusing is never retried in a loop.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from cdc_router.errors import FatalKafkaError

# Only what was measured, or is librdkafka's documented idempotence dead end; never an error
# that may mean another producer holds the id (INVALID_PRODUCER_ID_MAPPING, a fence).
RENEWABLE = frozenset({
    KafkaError.INVALID_TXN_STATE,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
})


class ProducerRenewal:
    """allows(failure): whether to replace the producer for it; committed() re-arms it."""

    def __init__(self) -> None:
        self._spent = False

    def allows(self, failure: FatalKafkaError) -> bool:
        if self._spent or failure.code not in RENEWABLE:
            return False
        self._spent = True
        return True

    def committed(self) -> None:
        self._spent = False
