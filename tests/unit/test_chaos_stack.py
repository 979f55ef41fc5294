"""The chaos campaign's reading of `kafka-transactions find-hanging`."""

from __future__ import annotations

from tests.chaos.stack import hanging_transactions

# As Kafka 4.3.0's TransactionsCommand prints it: tab-separated, a trailing tab on each line.
HEADER = ("Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\t"
          "LastTimestamp\tDuration(min)\t")


def test_no_hanging_transaction_is_the_header_alone():
    assert hanging_transactions(HEADER + "\n") == []
    assert hanging_transactions("") == []


def test_each_row_gives_its_topic_partition_and_start_offset():
    table = "\n".join([HEADER,
                       "connect-offsets\t19\t51\t0\t0\t4\t1764691200000\t16\t",
                       "orders\t0\t7\t2\t1\t1200\t1764691200000\t2\t", ""])
    assert hanging_transactions(table) == [("connect-offsets", "19", "4"),
                                           ("orders", "0", "1200")]


def test_text_that_is_not_the_table_lists_nothing():
    assert hanging_transactions("Error: the broker is not available\n") == []
