"""Redis dedup store: a leased "processing" claim before the effect, a "done" mark after.

Protocol for one key `<prefix><consumer group>:<event id>`:
1. `SET key processing:<token> NX PX lease_ms` claims the event for this worker.
   - Taken and "done": the event is a duplicate, acknowledge it.
   - Taken by another claim: BUSY; the consumer retries later and does not commit past it.
2. Run the effect.
3. A script's GET then `SET key done PX ttl_ms` marks it done, atomically; the GET tells whether
   our claim was still ours. (Not `SET ... GET`, which Redis before 6.2 refuses: review 47-e F1,
   every effect ran, its mark refused, the partition stalled for ever.)
   A raising effect instead deletes our claim (compare-and-delete), so a retry can start now.

What this store promises: a crash between claim and effect loses nothing (the claim expires
after the lease and the redelivered record is processed then), and a done mark within its TTL
makes redeliveries duplicates.

A done mark Redis refuses (a failover, a timeout) is remembered: the consumer's retry of the
same event in this process writes the mark without running the effect again.

What it cannot promise (each shown by tests/integration/test_redis_store.py):
- Effects outside Redis are not atomic with the done mark: a crash after the effect and
  before the done mark (or a retry in another process, after a rebalance) runs the effect
  again after the lease. Use the Postgres store when
  the effect is a database write, or make the effect itself idempotent.
- While the effect runs, a thread of the store renews the claim every lease_ms / 3 (only
  while the key still holds our token), so a slow handler keeps it, and a dead process's
  claim expires lease_ms after its last renewal. A claim whose renewals Redis refuses for a
  whole lease (an outage) can expire while the handler still runs and let a second worker
  run the event concurrently; that is logged (event=dedup_lease_lost) when the first worker
  finishes. A handler that never returns keeps its claim as long as its process lives.
- A Redis restart without persistence (or a failover to a replica that missed the writes)
  forgets done marks, and redelivered records run again. Use AOF with fsync for the marks
  you cannot afford to lose.
- Retention: a done mark expires after ttl_ms; a redelivery after that runs again.
- A consumer group holding ':' makes keys ambiguous: ("billing:eu", "e1") and
  ("billing", "eu:e1") share one key, so the second is taken for a duplicate (review 46 F8).
  Keep ':' out of group names (a warning is logged once per such group). The format stays:
  another one would leave every stored done mark unseen after an upgrade, and refusing such a
  group would force a rename, which loses its committed offsets and all its marks.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from cdc_router.consumer.checks import check_all
from cdc_router.consumer.dedup.store import (
    DedupKey,
    DedupStoreError,
    DedupStoreRefused,
    Outcome,
    run_effect,
)
from cdc_router.consumer.retry import whole_number
from cdc_router.errors import ConfigError

log = logging.getLogger(__name__)

DONE = b"done"
CLAIM_PREFIX = b"processing:"
# Events whose effect ran but whose done mark Redis refused, remembered for the retry; the
# oldest are forgotten beyond this (a retry comes within seconds, not thousands of events).
MAX_UNMARKED = 10_000

# Deletes the key only while it still holds our claim token: a claim that expired and was
# taken by another worker must not be released by us.
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# Extends the key's expiry only while it still holds our claim token.
_RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Sets the done mark and returns what the key held before (nil when nothing).
_MARK_SCRIPT = """
local previous = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return previous
"""


def _as_bytes(value: object) -> bytes | None:
    """Redis replies as bytes, or as str when the client has decode_responses=True."""
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()


# Ten years: Redis refused a TTL beyond a 64-bit count of ms, and the lease's renewal
# thread could not wait a lease of centuries (reread 52-l F6).
_MAX_MS = 10 * 365 * 24 * 3600 * 1000

class RedisDedupStore:
    """Claims and done marks in Redis (redis-py); the effect receives the Redis client."""

    def __init__(self, client: redis.Redis, *, lease_ms: int = 60_000,
                 ttl_ms: int = 7 * 24 * 3600 * 1000,
                 key_prefix: str = "cdc-router:dedup:") -> None:
        # Review 52-c F-med-5: "60000" was a TypeError traceback, and a NaN lease or a 1.5 ms
        # TTL was accepted and then refused by Redis on every record: a partition stalled.
        check_all("RedisDedupStore", [
                (callable(getattr(client, "register_script", None)), "client",
                 "must be a redis-py client, e.g. redis.Redis.from_url(url)",
                 type(client).__name__),  # the type: a URL string may hold a password
                (whole_number(lease_ms) and lease_ms <= _MAX_MS, "lease_ms",
                 f"must be a whole number of ms, at least 1 and at most {_MAX_MS} (10 years)",
                 lease_ms),
                (whole_number(ttl_ms) and ttl_ms <= _MAX_MS, "ttl_ms",
                 f"must be a whole number of ms, at least 1 and at most {_MAX_MS} (10 years)",
                 ttl_ms),
                (isinstance(key_prefix, str), "key_prefix", "must be a string", key_prefix)])
        if ttl_ms < lease_ms:
            raise ConfigError("must be at least lease_ms", source="RedisDedupStore",
                              field="ttl_ms", value=ttl_ms,
                              hint="a done mark must outlive the claim it replaces")
        self._client = client
        self.lease_ms = lease_ms
        self.ttl_ms = ttl_ms
        self._prefix = key_prefix
        self._release = client.register_script(_RELEASE_SCRIPT)
        self._mark = client.register_script(_MARK_SCRIPT)
        self._unmarked: OrderedDict[str, bytes] = OrderedDict()  # key -> our claim token
        self._warned: set[str] = set()  # groups with a ':', told once
        self._renewal = _Renewal(client.register_script(_RENEW_SCRIPT), lease_ms)

    def key(self, key: DedupKey) -> str:
        """The Redis key that holds `key`'s claim or done mark."""
        group = key.consumer_group
        if ":" in group and group not in self._warned:
            self._warned.add(group)
            first, rest = group.split(":", 1)
            log.warning("event=dedup_group_ambiguous group=%s: its keys can be group %s's "
                        "(event ids %s:...), whose events then count as done: keep ':' out "
                        "of group names", group, first, rest)
        return f"{self._prefix}{group}:{key.event_id}"

    def run_once(self, key: DedupKey, effect: Callable[[redis.Redis], None]) -> Outcome:
        """Claim, run `effect(client)`, mark done; see the module doc for what it promises."""
        name = self.key(key)
        unmarked = self._unmarked.get(name)
        if unmarked is not None:  # the effect ran already: only its mark is missing
            return self._mark_done(key, name, unmarked, retry=True)
        token = CLAIM_PREFIX + uuid.uuid4().hex.encode()
        try:
            claimed = self._client.set(name, token, nx=True, px=self.lease_ms)
            if not claimed:
                held = self._client.get(name)
                # None: the holder's claim expired between our SET and GET; the caller's
                # retry will claim it.
                return Outcome.DUPLICATE if _as_bytes(held) == DONE else Outcome.BUSY
        except redis.RedisError as error:
            raise DedupStoreError(f"cannot claim event {key.event_id} in Redis: {error}") \
                from error
        try:
            with self._renewal.held(name, token):
                run_effect(effect, self._client)
        except BaseException:
            self._release_claim(name, token)
            raise
        return self._mark_done(key, name, token, retry=False)

    def check_usable(self) -> None:
        """What the consumers ask at start (QA 57-c F-2): a PING. DedupStoreRefused when Redis
        refuses the client's login or the command; DedupStoreError when it does not answer (an
        outage, no verdict)."""
        try:
            self._client.ping()
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as error:
            raise DedupStoreRefused(f"Redis refuses the dedup store's client: {error}; check "
                                    "the client's username and password, and that its ACL "
                                    "allows GET, SET, EVALSHA and PEXPIRE") from error
        except redis.RedisError as error:
            raise DedupStoreError(f"cannot reach Redis: {error}") from error

    def _mark_done(self, key: DedupKey, name: str, token: bytes, *, retry: bool) -> Outcome:
        """Mark `name` done over our claim `token`; DedupStoreError, and `name` remembered as
        unmarked for the retry, when Redis refuses."""
        try:
            previous = _as_bytes(self._mark(keys=[name], args=[DONE, self.ttl_ms]))
        except redis.RedisError as error:
            self._unmarked[name] = token
            self._unmarked.move_to_end(name)
            while len(self._unmarked) > MAX_UNMARKED:
                self._unmarked.popitem(last=False)
            raise DedupStoreError(f"effect of event {key.event_id} ran but its done mark "
                                  f"failed: {error}; the retry marks it without running it "
                                  "again") from error
        self._unmarked.pop(name, None)
        # On a retry, DONE may be our own earlier try, which failed in the client (a timeout)
        # after Redis had written it; the first time, it is another worker's: our lease is lost.
        if previous != token and not (retry and previous == DONE):
            # DONE the first time is another worker's mark after our lease expired (the
            # effect ran twice), or our own, sent again by redis-py after a dropped connection
            # (QA 47-c F5): the values cannot tell, so the line says both.
            log.warning("event=dedup_lease_lost key=%r lease_ms=%d held=%r%s", name,
                        self.lease_ms, previous, " (or our own mark, sent again by the client "
                        "after a reconnect)" if previous == DONE else "")
        return Outcome.DONE

    def state(self, key: DedupKey) -> str | None:
        """"done", "processing" or None (unknown or expired): for tests and operators."""
        value = self._client.get(self.key(key))
        if value is None:
            return None
        return "done" if _as_bytes(value) == DONE else "processing"

    def _release_claim(self, name: str, token: bytes) -> None:
        try:
            self._release(keys=[name], args=[token])
        except redis.RedisError as error:
            # The claim then simply expires after the lease; the retry waits until then.
            log.warning("event=dedup_release_failed key=%r error=%r", name, str(error))

    def close(self) -> None:
        """Stop renewing and close the client's connection pool."""
        self._renewal.stop()
        self._client.close()


class _Renewal:
    """One daemon thread that renews the claims whose effects are running, every lease / 3;
    started by a claim, it ends when no claim is left (a store dropped without close() keeps
    no thread: QA 49-h F4) or at stop()."""

    def __init__(self, renew: Callable[..., object], lease_ms: int) -> None:
        self._renew, self._lease_ms = renew, lease_ms
        self._lock = threading.Lock()
        self._claims: dict[str, bytes] = {}  # key -> our claim token, while its effect runs
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(self, name: str, token: bytes) -> Iterator[None]:
        with self._lock:
            self._claims[name] = token
            if self._thread is None or not self._thread.is_alive():
                self._stopped.clear()
                self._thread = threading.Thread(target=self._run, name="dedup-lease-renewal",
                                                daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._claims.pop(name, None)

    def stop(self) -> None:
        self._stopped.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopped.wait(self._lease_ms / 3000):
            with self._lock:
                claims = list(self._claims.items())
                if not claims:  # the next claim starts a thread again
                    self._thread = None
                    return
            for name, token in claims:
                try:
                    self._renew(keys=[name], args=[token, self._lease_ms])
                except redis.RedisError as error:
                    # Tried again at the next round; the claim expires if it lasts a lease.
                    log.warning("event=dedup_lease_renewal_failed key=%r lease_ms=%d "
                                "error=%r", name, self._lease_ms, str(error))
