"""murmur2 and the Java default partitioner, against vectors from Kafka and kafka-python."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_router.partitioner import java_default_partition, murmur2, to_positive

# Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# kafka-python's test_murmur2_java_compatibility: partitions among 1000, which its authors
# compared with the output of Kafka's Java partitioner. Covers the empty key and every tail length.
JAVA_PARTITION_VECTORS_1000 = [
    (b"", 681),
    (b"a", 524),
    (b"ab", 434),
    (b"abc", 107),
    (b"123456789", 566),
    (b"\x00 ", 742),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_utils_test(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("key", "expected"), JAVA_PARTITION_VECTORS_1000)
def test_partition_matches_java_producer(key: bytes, expected: int) -> None:
    assert java_default_partition(key, 1000) == expected


def test_to_positive_clears_the_sign_bit_like_java() -> None:
    assert to_positive(-(2**31)) == 0  # Math.abs would overflow here; Kafka's toPositive does not
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(5) == 5


def test_single_partition_is_always_zero() -> None:
    assert java_default_partition("Ünïcode aggregate".encode(), 1) == 0


def test_rejects_zero_partitions() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        java_default_partition(b"k", 0)


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_is_in_range_and_hash_is_a_java_int(key: bytes, partitions: int) -> None:
    assert -(2**31) <= murmur2(key) < 2**31
    assert 0 <= java_default_partition(key, partitions) < partitions
