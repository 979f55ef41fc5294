"""Kafka's Java default partitioner for keyed records: murmur2, made positive, modulo partitions.

librdkafka's default partitioner (`consistent_random`, CRC32) places a key elsewhere than the
Java client does. The router computes the partition itself so that a record lands where a Java
producer (Kafka Streams, Kafka Connect, the EventRouter SMT) would have put the same key, and so
that it can partition by the aggregate id while keying by the event id.
"""

from __future__ import annotations

from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
# Partitions remembered per (key, partition count): murmur2 in Python costs about 2 us, a hit
# of the cache 0.1 us, and the router hashes the aggregate id, which recurs (an order's events).
# An entry is about 200 bytes, so the cache stays under 4 MB.
PARTITION_CACHE_SIZE = 16_384


def murmur2(data: bytes) -> int:
    """Return Kafka's `Utils.murmur2(data)`: a signed 32-bit int, exactly as Java computes it.

    32-bit MurmurHash2 with Kafka's seed, reading 4-byte blocks little-endian; all arithmetic
    wraps at 32 bits, as Java's int does.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    blocks = length // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[4 * blocks :]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    # Back to Java's signed int so the value compares equal to Kafka's own test vectors.
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Return Kafka's `Utils.toPositive`: clear the sign bit (not abs(), which overflows)."""
    return number & 0x7FFFFFFF


@lru_cache(maxsize=PARTITION_CACHE_SIZE)
def java_default_partition(key: bytes, num_partitions: int) -> int:
    """Return the partition Kafka's Java producer picks for `key` among `num_partitions`.

    `toPositive(murmur2(key)) % numPartitions`, as in `BuiltInPartitioner.partitionForKey`.
    Raises ValueError when num_partitions < 1.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions
