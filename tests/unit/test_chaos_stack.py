"""The chaos campaign's reading of `kafka-transactions find-hanging`."""

from __future__ import annotations

from tests.chaos.stack import hanging_transactions
from tests.chaos.verifier import HangingAbort

# As Kafka 4.3.0's TransactionsCommand printed it on the chaos stack (CI rehearsal, session
# 29): log lines first (the stack's log4j configuration), then columns padded with spaces and
# separated by tabs, a trailing tab on each line.
LOGS = ("[2026-12-02 17:55:50,579] INFO AdminClientConfig values: \n"
        "\tbootstrap.servers = [127.0.0.1:39092]\n\tclient.id = \n")
HEADER = ("Topic                               \tPartition\tProducerId\tProducerEpoch\t"
          "CoordinatorEpoch\tStartOffset\tLastTimestamp\tDuration(min)\t")


def test_no_hanging_transaction_is_the_header_alone():
    assert hanging_transactions(LOGS + HEADER + "\n") == []
    assert hanging_transactions("") == []


def test_each_row_gives_its_partition_start_offset_and_producer():
    table = LOGS + "\n".join([
        HEADER,
        "chaos-1b44c5fa.public.chaos_1b44c5fa\t0        \t1         \t4            \t0"
        "               \t3132       \t1796233660526\t8            \t",
        "connect-offsets                     \t18       \t1         \t4            \t0"
        "               \t6          \t1796233660527\t8            \t", ""])
    assert hanging_transactions(table) == [
        HangingAbort("chaos-1b44c5fa.public.chaos_1b44c5fa", 0, 3132, 1, 4),
        HangingAbort("connect-offsets", 18, 6, 1, 4)]


def test_text_that_is_not_the_table_lists_nothing():
    assert hanging_transactions("Error: the broker is not available\n") == []
