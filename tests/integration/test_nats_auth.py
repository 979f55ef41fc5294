"""NATS with credentials and TLS on a real nats-server: the router, `streams apply` and the
stream reader reach it with the `nats:` section's user, password and CA; a wrong password
stops the router with one line naming the fields, never a retry loop or a traceback."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nats.js.api import StreamConfig

from cdc_router.config.nats import NatsSettings
from cdc_router.consumer import ConsumedEvent, JetStreamConsumer, JetStreamSettings
from cdc_router.consumer.dedup.memory import MemoryDedupStore
from cdc_router.errors import JetStreamConsumerError, JetStreamRefused
from cdc_router.local.nats_server import nats_executable  # /usr/sbin off PATH too
from cdc_router.nats.connection import connect_options
from cdc_router.nats.publisher import JetStreamPublisher, NatsMessage
from tests.integration.nats_server import nats_server, read_stream
from tests.integration.pipeline import REPO, Pipeline, Row, pipeline
from tests.integration.support import StackEndpoints, free_port

pytestmark = pytest.mark.integration

USER, PASSWORD = "router", "s3cret-Pa55"


def _certificate(subject: str, key: Any, issuer: tuple[str, Any] | None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1)))
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                        critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_pki(home: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signed: (ca, cert, key) PEM files."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), \
        ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("cdc-router test CA", ca_key, None)
    server = _certificate("127.0.0.1", server_key, ("cdc-router test CA", ca_key))
    paths = home / "ca.pem", home / "server.pem", home / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return paths


@contextmanager
def _nats_with(home: Path, settings: str) -> Iterator[int]:
    """nats-server with JetStream and `settings` (its config file's text) on a free port of
    127.0.0.1; yields the port. Stopped by its pid."""
    port = free_port()
    config = home / "nats.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\n'
                      f'jetstream {{ store_dir: "{home / "store"}" }}\n{settings}')
    log = (home / "nats.log").open("ab")
    server = subprocess.Popen([nats_executable(), "-c", str(config)], stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while b"Server is ready" not in (home / "nats.log").read_bytes():
            assert server.poll() is None and time.monotonic() < deadline, \
                (home / "nats.log").read_text()
            time.sleep(0.1)
        yield port
    finally:
        server.terminate()  # by its pid
        server.wait(timeout=30)
        log.close()


@contextmanager
def _secured_nats(home: Path) -> Iterator[tuple[str, Path]]:
    """nats-server with JetStream, a user and TLS; (url, CA file)."""
    ca, cert, key = _write_pki(home)
    with _nats_with(home, f'authorization {{ user: "{USER}", password: "{PASSWORD}" }}\n'
                          f'tls {{ cert_file: "{cert}", key_file: "{key}", ca_file: "{ca}" }}\n'
                    ) as port:
        yield f"tls://127.0.0.1:{port}", ca


def _configure(pipe: Pipeline, url: str, ca: Path, password: str) -> tuple[Path, str]:
    prefix = pipe.name.replace("_", "-")
    config = yaml.safe_load(pipe.config_path.read_text())
    config["routes"][0] = {"match": {"aggregate_type": "Order*"},
                           "nats": {"subject": prefix + ".{type}"}}
    config["nats"] = {"url": url, "user": USER, "password": password,
                      "tls": {"ca_file": str(ca)},
                      "streams": [{"name": prefix.upper(), "subjects": [f"{prefix}.>"]}]}
    pipe.config_path.write_text(yaml.safe_dump(config))
    return pipe.config_path, prefix.upper()


def test_the_router_publishes_over_tls_with_a_password_and_a_wrong_one_stops_it(
        stack: StackEndpoints, tmp_path: Path) -> None:
    rows: list[Row] = [("Order", f"order-{i % 5}", "OrderPaid", {"seq": i}) for i in range(200)]
    with _secured_nats(tmp_path) as (url, ca), pipeline(stack, tmp_path) as pipe:
        path, stream = _configure(pipe, url, ca, PASSWORD)
        applied = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                                  str(path), "--yes"], capture_output=True, text=True, cwd=REPO,
                                 check=False)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        pipe.start_router(wait=True)
        ids = pipe.insert(rows)
        tls = {"user": USER, "password": PASSWORD,
               "tls": ssl.create_default_context(cafile=str(ca))}
        deadline = time.monotonic() + 90
        while len(read_stream(url, stream, **tls)) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.5)
        seen = Counter(message.headers["id"] for message in read_stream(url, stream, **tls))
        pipe.kill_router()
        consumed = _consume(url, stream, ca, PASSWORD, len(ids))
        with pytest.raises(JetStreamConsumerError, match="refused our credentials") as refusal:
            _consume(url, stream, ca, "wrong", 1)

        _configure(pipe, url, ca, "wrong")
        pipe.start_router("b")
        pipe.insert(rows[:5])  # a batch with JetStream records makes it connect
        refused = pipe.routers["b"].wait(timeout=120)
        log = pipe.router_log("b")
        wrong_apply = subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply",
                                      "-c", str(path), "--dry-run"], capture_output=True,
                                     text=True, cwd=REPO, check=False)
    assert seen == Counter(ids), pipe.router_log()[-3000:]
    assert consumed == Counter(ids), "the idempotent consumer reads it with the same settings"
    assert "\n" not in str(refusal.value) and "wrong" not in str(refusal.value)
    assert refused == 1, log[-3000:]
    assert "refused our credentials" in log and "nats.password" in log, log[-3000:]
    assert "wrong" not in log, "the password is never printed"
    assert "Traceback" not in log
    assert wrong_apply.returncode == 1
    assert "refused our credentials" in wrong_apply.stderr
    assert len(wrong_apply.stderr.strip().splitlines()) == 1, wrong_apply.stderr


def _consume(url: str, stream: str, ca: Path, password: str, count: int) -> Counter[str]:
    """Run a JetStreamConsumer with the router's kind of `nats:` settings until it handled
    `count` events (at most 60 s); the event ids it handled."""
    handled: Counter[str] = Counter()
    options = connect_options(NatsSettings.model_validate(
        {"url": url, "user": USER, "password": password, "tls": {"ca_file": str(ca)}}))
    durable = "auth-ok" if password == PASSWORD else "auth-bad"  # never the password itself
    settings = JetStreamSettings(url=url, stream=stream, durable=durable,
                                 filter_subjects=(f"{stream.lower()}.OrderPaid",),
                                 dead_letter_subject=f"{stream.lower()}.dlq",
                                 connect_timeout_s=3, connect_options=options)

    def handle(event: ConsumedEvent, context: Any) -> None:
        handled[event.event_id] += 1
        if sum(handled.values()) >= count:
            consumer.stop()

    consumer = JetStreamConsumer(settings, MemoryDedupStore(), handle, decoder=json.loads)
    timer = threading.Timer(60, consumer.stop)
    timer.start()
    try:
        consumer.run()
    finally:
        timer.cancel()
    return handled


def _streams_apply(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdc_router", "streams", "apply", "-c",
                           str(config), "--dry-run"], capture_output=True, text=True, cwd=REPO,
                          check=False)


def _config_file(path: Path, url: str, tls: dict[str, str]) -> Path:
    path.write_text(yaml.safe_dump({
        "source": {"topics": ["raw"]}, "routes": [{"nats": {"subject": "orders.x"}}],
        "nats": {"url": url, "user": USER, "password": PASSWORD, "tls": tls,
                 "streams": [{"name": "ORDERS", "subjects": ["orders.>"]}]}}))
    return path


def test_tls_settings_that_cannot_work_stop_with_one_line_naming_the_field(
        tmp_path: Path) -> None:
    (tmp_path / "secured").mkdir()
    (tmp_path / "other-ca").mkdir()
    (tmp_path / "plain").mkdir()
    other_ca, _, _ = _write_pki(tmp_path / "other-ca")
    with _secured_nats(tmp_path / "secured") as (url, ca), \
            nats_server(tmp_path / "plain") as plain:
        untrusted = _streams_apply(_config_file(tmp_path / "a.yaml", url,
                                                {"ca_file": str(other_ca)}))
        clear_text = _streams_apply(_config_file(tmp_path / "b.yaml", plain.url,
                                                 {"ca_file": str(ca)}))
    assert untrusted.returncode == 1, untrusted.stdout + untrusted.stderr
    assert "TLS handshake" in untrusted.stderr and "nats.tls.ca_file" in untrusted.stderr
    assert clear_text.returncode == 1, clear_text.stdout + clear_text.stderr
    assert "does not require TLS" in clear_text.stderr and "'nats.tls'" in clear_text.stderr
    for done in (untrusted, clear_text):
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert PASSWORD not in done.stderr


def test_a_subject_the_user_may_not_publish_to_is_refused_alone(tmp_path: Path) -> None:
    # Review 44 M4: nats-server drops such a publish and says so only in an -ERR, which
    # nats-py hands to the error callback: the ack never came, the batch timed out and was
    # retried for ever, the cause logged at DEBUG. Now that message is refused (a dead letter
    # in the router), the others of the batch stored.
    permissions = ('{ publish: { allow: ["perm.ok", "$JS.API.>"] }, '
                   'subscribe: { allow: ["_INBOX.>"] } }')  # perm.Denied: mixed case, as
    # nats-py lowercases the server's -ERR line (review 44-3)
    settings = (f'authorization {{ users: [ {{ user: "{USER}", password: "{PASSWORD}", '
                f'permissions: {permissions} }} ] }}\n')
    with _nats_with(tmp_path, settings) as port:
        url = f"nats://127.0.0.1:{port}"
        login = {"user": USER, "password": PASSWORD}

        async def add_stream() -> None:
            client = await nats.connect(url, **login)
            try:
                await client.jetstream().add_stream(StreamConfig(name="PERM",
                                                                 subjects=["perm.>"]))
            finally:
                await client.close()

        asyncio.run(add_stream())
        publisher = JetStreamPublisher(url, ack_timeout_s=2, connect_timeout_s=5,
                                       options=login)
        try:
            with pytest.raises(JetStreamRefused) as refused:
                publisher.publish_batch([NatsMessage("perm.ok", b"{}", {}, "p-1"),
                                         NatsMessage("perm.Denied", b"{}", {}, "p-2"),
                                         NatsMessage("perm.ok", b"{}", {}, "p-3")])
            stored = publisher.publish_batch([NatsMessage("perm.ok", b"{}", {}, "p-4")])
        finally:
            publisher.close()
        ids = [m.headers["Nats-Msg-Id"] for m in read_stream(url, "PERM", **login)]
    assert list(refused.value.refused) == [1]
    assert "perm.Denied" in refused.value.refused[1]
    assert "may not publish" in refused.value.refused[1]
    assert ids == ["p-1", "p-3", "p-4"]
    assert stored.stored == 1, "the next batch is not blamed for the earlier refusal"
