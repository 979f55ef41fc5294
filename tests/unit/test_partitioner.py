"""murmur2 and the Java default partitioner, against vectors from Kafka and kafka-python."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_router.local.versions import KAFKA_VERSION
from cdc_router.router.partitioner import java_default_partition, murmur2, to_positive

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


_JAVA_CHECK = """
import java.io.*;
import java.util.HexFormat;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;

public class Check {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            byte[] key = HexFormat.of().parseHex(line.trim());
            int partition = BuiltInPartitioner.partitionForKey(key, 37);
            System.out.println(Utils.murmur2(key) + " " + partition);
        }
    }
}
"""


def _kafka_libs() -> Path | None:
    cache = os.environ.get("CDC_ROUTER_JAR_CACHE") or str(Path.home() / ".cache/cdc-router/jars")
    libs = Path(cache) / f"kafka-{KAFKA_VERSION}" / "libs"
    return libs if (libs / f"kafka-clients-{KAFKA_VERSION}.jar").exists() else None


@pytest.mark.skipif(shutil.which("java") is None or _kafka_libs() is None,
                    reason="needs java and the local stack's Kafka jars (cdc-router local up)")
def test_matches_kafkas_own_java_code_on_random_keys(tmp_path: Path) -> None:
    rng = random.Random(7)
    keys = [b"", "Ünïcode-Bestellung".encode()] + [
        rng.randbytes(rng.randrange(64)) for _ in range(2000)]
    source = tmp_path / "Check.java"
    source.write_text(_JAVA_CHECK, encoding="utf-8")
    answer = subprocess.run(["java", "-cp", f"{_kafka_libs()}/*", str(source)], check=True,
                            input="".join(key.hex() + "\n" for key in keys),
                            capture_output=True, text=True, timeout=120).stdout.split()
    java = [(int(answer[i]), int(answer[i + 1])) for i in range(0, len(answer), 2)]
    assert java == [(murmur2(key), java_default_partition(key, 37)) for key in keys]


def test_cached_partitions_are_the_computed_ones() -> None:
    rng = random.Random(14)
    keys = [rng.randbytes(rng.randint(0, 40)) for _ in range(300)]
    for _ in range(2):  # the second round is served by the cache
        for key in keys:
            for count in (1, 7, 1000):
                assert java_default_partition(key, count) == to_positive(murmur2(key)) % count
    with pytest.raises(ValueError, match="at least 1"):
        java_default_partition(b"k", 0)
