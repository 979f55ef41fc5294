"""RedisDedupStore on a real redis-server: what it promises and, one test each, what it cannot.

Crashes are real: a child process claims (and maybe runs the effect) and dies with os._exit
before the next step, exactly where a kill -9 would stop it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_router.consumer import ConsumedEvent, ConsumerSettings, IdempotentConsumer, RetryPolicy
from cdc_router.consumer.dedup import DedupKey, DedupStoreError, Outcome
from cdc_router.consumer.dedup.redis import RedisDedupStore
from cdc_router.errors import ConfigError
from tests.integration.redis_server import RedisServer
from tests.integration.support import StackEndpoints, unique

pytestmark = pytest.mark.integration

KEY = DedupKey("fulfillment", "evt-1")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    yield redis_server
    redis_server.stop()


class EffectLog:
    """An effect outside Redis: a line appended to a file per run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def effect(self, _client: object) -> None:
        with self.path.open("a") as file:
            file.write("shipped\n")

    @property
    def runs(self) -> int:
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll `condition`; the timeout only bounds a hang, it asserts nothing about speed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


# The child claims, optionally runs the effect, then dies as kill -9 would: no cleanup, no
# done mark, no release.
_CRASHING_WORKER = """
import os, sys
import redis
from cdc_router.consumer.dedup import DedupKey
from cdc_router.consumer.dedup.redis import RedisDedupStore
url, lease_ms, effect_file, crash_point, group = sys.argv[1:6]
store = RedisDedupStore(redis.Redis.from_url(url), lease_ms=int(lease_ms))
def effect(_client):
    if crash_point == "after-effect":
        with open(effect_file, "a") as f:
            f.write("shipped\\n")
    os._exit(9)
store.run_once(DedupKey(group, "evt-1"), effect)
"""


def crash_worker(server: RedisServer, lease_ms: int, effects: EffectLog, point: str,
                 group: str = "fulfillment") -> None:
    result = subprocess.run([sys.executable, "-c", _CRASHING_WORKER, server.url, str(lease_ms),
                             str(effects.path), point, group], check=False, timeout=60)
    assert result.returncode == 9


def test_first_delivery_is_done_and_redeliveries_are_duplicates(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisDedupStore(server.client(), lease_ms=5_000, ttl_ms=60_000)
    effects = EffectLog(tmp_path / "effects")
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert store.run_once(KEY, effects.effect) is Outcome.DUPLICATE
    assert store.run_once(DedupKey("billing", "evt-1"), effects.effect) is Outcome.DONE
    assert effects.runs == 2
    assert store.state(KEY) == "done"
    assert 55_000 < server.client().pttl(store.key(KEY)) <= 60_000  # the retention window


async def shipped_async(client: object) -> None:
    raise AssertionError("never awaited, never run")


def test_an_effect_that_returns_a_coroutine_is_a_failure_never_a_done_mark(
        server: RedisServer) -> None:
    # Review 52-c F-HIGH-11: the store marked the event done; the async body never ran.
    store = RedisDedupStore(server.client(), lease_ms=5_000, ttl_ms=60_000)
    with pytest.raises(TypeError, match="returned coroutine 'shipped_async'"):
        store.run_once(KEY, shipped_async)  # type: ignore[arg-type]
    assert store.state(KEY) is None  # not done, and its claim released for the retry


class Redis60(redis.Redis):
    """A client of a Redis before 6.2, which refuses `SET ... GET` as a syntax error."""

    def set(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        if kwargs.get("get"):
            raise redis.ResponseError("ERR syntax error")
        return super().set(*args, **kwargs)  # type: ignore[arg-type]


def test_a_redis_before_6_2_marks_events_done(server: RedisServer, tmp_path: Path) -> None:
    # Review 47-e F1: the done mark was `SET ... GET`: each effect ran, its mark was refused,
    # and the retry found it unmarked, for ever (the partition stalled).
    store = RedisDedupStore(Redis60.from_url(server.url), lease_ms=5_000)
    effects = EffectLog(tmp_path / "effects")
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert store.run_once(KEY, effects.effect) is Outcome.DUPLICATE
    assert effects.runs == 1 and store.state(KEY) == "done"


def test_a_raising_effect_releases_its_claim_so_the_retry_runs_at_once(
        server: RedisServer) -> None:
    store = RedisDedupStore(server.client(), lease_ms=600_000)

    def fail(_client: object) -> None:
        raise ConnectionError("carrier API down")

    with pytest.raises(ConnectionError):
        store.run_once(KEY, fail)
    assert store.state(KEY) is None
    assert store.run_once(KEY, lambda _c: None) is Outcome.DONE


def test_a_done_mark_redis_refuses_is_written_by_the_retry_without_a_second_effect(
        server: RedisServer, tmp_path: Path) -> None:
    # Review, session 26: Redis refused the done mark once (here NOREPLICAS, as in a failover);
    # the retry found its own claim BUSY until the lease ended, then ran the effect again.
    store = RedisDedupStore(server.client(), lease_ms=200, ttl_ms=60_000)
    operator = server.client()
    effects = EffectLog(tmp_path / "effects")

    def effect_then_refusal(client: object) -> None:
        effects.effect(client)
        operator.config_set("min-replicas-to-write", 1)  # writes refused from now on

    with pytest.raises(DedupStoreError, match=r"done mark failed.*without running it again"):
        store.run_once(KEY, effect_then_refusal)
    with pytest.raises(DedupStoreError):  # still refused: still no second effect
        store.run_once(KEY, effects.effect)
    time.sleep(0.4)  # the claim's lease is over
    operator.config_set("min-replicas-to-write", 0)
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert store.run_once(KEY, effects.effect) is Outcome.DUPLICATE
    assert effects.runs == 1 and store.state(KEY) == "done"


def test_a_release_never_deletes_another_workers_claim(server: RedisServer) -> None:
    client = server.client()
    store = RedisDedupStore(client, lease_ms=600_000)

    def lose_claim_then_fail(_client: object) -> None:
        client.set(store.key(KEY), b"processing:other-worker", px=600_000)  # lease stolen
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.run_once(KEY, lose_claim_then_fail)
    assert client.get(store.key(KEY)) == b"processing:other-worker"


def test_crash_after_claim_before_effect_loses_nothing(server: RedisServer,
                                                       tmp_path: Path) -> None:
    effects = EffectLog(tmp_path / "effects")
    # 5 s: the lease must outlast the child's exit and two calls on a busy host.
    crash_worker(server, 5_000, effects, "before-effect")
    store = RedisDedupStore(server.client(), lease_ms=5_000)
    # While the dead worker's lease lasts, the event is busy: not done, not skipped.
    assert store.state(KEY) == "processing"
    assert store.run_once(KEY, effects.effect) is Outcome.BUSY
    assert effects.runs == 0
    wait_until(lambda: store.state(KEY) is None)  # the lease expires
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert effects.runs == 1


def test_limit_effect_outside_redis_runs_twice_after_crash_before_done_mark(
        server: RedisServer, tmp_path: Path) -> None:
    effects = EffectLog(tmp_path / "effects")
    crash_worker(server, 1_500, effects, "after-effect")
    assert effects.runs == 1
    store = RedisDedupStore(server.client(), lease_ms=1_500)
    wait_until(lambda: store.state(KEY) is None)
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert effects.runs == 2  # the documented limit: not atomic with the done mark


def test_a_slow_handler_keeps_its_claim_by_renewing_it(
        server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Before, the lease ran out under a handler slower than lease_ms and a second worker ran
    # the event concurrently (a documented limit): the store now renews it every lease / 3.
    effects = EffectLog(tmp_path / "effects")
    slow = RedisDedupStore(server.client(), lease_ms=1_500)
    fast = RedisDedupStore(server.client(), lease_ms=1_500)
    in_effect, release = threading.Event(), threading.Event()
    outcomes: list[Outcome] = []

    def slow_effect(client: object) -> None:
        in_effect.set()
        assert release.wait(60)
        effects.effect(client)

    worker = threading.Thread(target=lambda: outcomes.append(slow.run_once(KEY, slow_effect)))
    worker.start()
    assert in_effect.wait(30)
    held_until = time.monotonic() + 3 * 1.5  # three leases: each would have expired
    while time.monotonic() < held_until:
        assert fast.run_once(KEY, effects.effect) is Outcome.BUSY
        time.sleep(0.1)
    assert effects.runs == 0
    with caplog.at_level(logging.WARNING, logger="cdc_router.consumer.dedup.redis"):
        release.set()
        worker.join(30)
    assert outcomes == [Outcome.DONE] and effects.runs == 1
    assert fast.run_once(KEY, effects.effect) is Outcome.DUPLICATE and effects.runs == 1
    assert "event=dedup_lease_lost" not in caplog.text
    slow.close()
    assert server.client().pttl(slow.key(KEY)) > 1_500  # the done mark's TTL, not a lease


def test_limit_a_restart_without_persistence_forgets_done_marks(server: RedisServer,
                                                                tmp_path: Path) -> None:
    effects = EffectLog(tmp_path / "effects")
    assert RedisDedupStore(server.client()).run_once(KEY, effects.effect) is Outcome.DONE
    server.restart()
    assert RedisDedupStore(server.client()).run_once(KEY, effects.effect) is Outcome.DONE
    assert effects.runs == 2


def test_with_aof_fsync_always_done_marks_survive_a_kill_9(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis-aof", persistent=True)
    server.start()
    try:
        effects = EffectLog(tmp_path / "effects")
        assert RedisDedupStore(server.client()).run_once(KEY, effects.effect) is Outcome.DONE
        server.restart(signal.SIGKILL)
        assert RedisDedupStore(server.client()).run_once(KEY, effects.effect) \
            is Outcome.DUPLICATE
        assert effects.runs == 1
    finally:
        server.stop()


def test_a_redelivery_after_the_ttl_is_no_longer_recognised(server: RedisServer,
                                                            tmp_path: Path) -> None:
    effects = EffectLog(tmp_path / "effects")
    store = RedisDedupStore(server.client(), lease_ms=100, ttl_ms=2_000)  # 2 s: a busy host
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert store.run_once(KEY, effects.effect) is Outcome.DUPLICATE
    wait_until(lambda: store.state(KEY) is None)  # the done mark aged out
    assert store.run_once(KEY, effects.effect) is Outcome.DONE
    assert effects.runs == 2


def test_an_unreachable_redis_is_a_store_error_not_a_handler_failure(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis-gone")  # never started: nothing listens
    store = RedisDedupStore(redis.Redis.from_url(server.url, socket_connect_timeout=1))
    with pytest.raises(DedupStoreError, match="cannot claim"):
        store.run_once(KEY, lambda _c: None)


def test_bad_settings_are_config_errors(server: RedisServer) -> None:
    with pytest.raises(ConfigError, match="ttl_ms"):
        RedisDedupStore(server.client(), lease_ms=10_000, ttl_ms=1_000)


def test_through_the_loop_a_crashed_claim_holds_the_partition_until_its_lease_ends(
        stack: StackEndpoints, server: RedisServer, tmp_path: Path) -> None:
    """The consume loop on a real broker: BUSY is retried, never committed past, then done."""
    topic, group = unique("payments_confirmed"), unique("fulfillment")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1), NewTopic(f"{topic}.dlq", 1, 1)]
                                      ).values():
        future.result(60)
    effects = EffectLog(tmp_path / "effects")
    # A worker claims evt-1 and dies before its effect; its lease would last ten minutes.
    crash_worker(server, 600_000, effects, "before-effect", group=group)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    producer.produce(topic, key=b"evt-1", value=b"{}")
    producer.produce(topic, key=b"evt-2", value=b"{}")
    assert producer.flush(60) == 0
    store = RedisDedupStore(server.client(), lease_ms=600_000)
    handled: list[str] = []

    def handler(event: ConsumedEvent, client: redis.Redis) -> None:
        handled.append(event.event_id)
        effects.effect(client)

    settings = ConsumerSettings(
        bootstrap_servers=stack.bootstrap_servers, group_id=group, topics=(topic,),
        dead_letter_topic=f"{topic}.dlq", commit_interval_s=0.1,
        retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.05, max_backoff_s=0.2))
    consumer = IdempotentConsumer(settings, store, handler)
    runner = threading.Thread(target=consumer.run)
    runner.start()
    reader = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": group})

    def committed() -> int:
        offset: int = reader.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
        return offset

    try:
        # Busy many times over, well past max_attempts: a live claim is no handler failure.
        wait_until(lambda: consumer.stats.retries >= 5, 120)
        assert handled == [] and committed() < 1 and consumer.stats.dead_lettered == 0
        server.client().pexpire(store.key(DedupKey(group, "evt-1")), 1)  # the lease runs out
        wait_until(lambda: committed() == 2, 120)
    finally:
        consumer.stop()
        runner.join(60)
        reader.close()
        for future in admin.delete_topics([topic, f"{topic}.dlq"]).values():
            future.result(60)
    assert handled == ["evt-1", "evt-2"]
    assert effects.runs == 2
    assert store.state(DedupKey(group, "evt-1")) == "done"
