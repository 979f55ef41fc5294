"""librdkafka's log lines: the same line, numbers aside, once a window (QA session 27-b: a
Kafka outage logged 7,116 ERROR lines in 6 minutes)."""

from __future__ import annotations

import logging

import pytest

from cdc_router.kafka.logs import RepeatFilter


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("cdc_router.librdkafka", level, __file__, 1, "%s", (message,),
                             None)


def test_a_repeated_line_passes_once_a_window_and_then_counts_the_rest() -> None:
    now = [0.0]
    repeats = RepeatFilter(window_s=60, clock=lambda: now[0])
    line = "FAIL [rdkafka#producer-1]: Connect to ipv4#127.0.0.1:19092 failed (after {}ms)"
    passed = []
    for second in range(130):
        now[0] = float(second)
        record = _record(line.format(second % 7))
        if repeats.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 3  # at 0 s, 60 s and 120 s
    assert passed[1].endswith("(59 like it in the last 60s not logged)")
    assert repeats.filter(_record("another line"))  # other lines are not held
    assert repeats.filter(_record(line.format(1), logging.WARNING))  # nor other levels


def test_an_admin_clients_lines_reach_its_logger_only_when_served() -> None:
    # QA 31-d: an AdminClient hands librdkafka's lines to its logger only in poll(), which
    # nothing called: `topics apply` and `status` never saw a wrong SASL password's line.
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from cdc_router.kafka.logs import serve_logs

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.served")
    logger.addHandler(Collect())
    admin = AdminClient({"bootstrap.servers": "127.0.0.1:1", "logger": logger})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1)
    assert lines == []
    serve_logs(admin)
    assert any("127.0.0.1:1" in line and "failed" in line for line in lines), lines


def test_a_kafka_line_names_the_newest_refusal_while_it_is_fresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_router.kafka import logs

    monkeypatch.setattr(logs, "_REFUSALS", [])
    monkeypatch.setattr(logs, "_CLUSTER", [])
    assert logs.with_kafka_refusal("Kafka: _TRANSPORT") == "Kafka: _TRANSPORT"
    logs.librdkafka_logger().error("SASL authentication error: Authentication failed")
    assert logs.refused_login() is not None and \
        logs.refused_login().startswith("Kafka refused this process's credentials: SASL ")
    logs.note_cluster("b:9092,c:9092")
    # Review 54-k F-4: every command's line is init_failure's text, not its own guess; review
    # 54-m F-8: naming the bootstrap servers, as the line it replaces did.
    for line in ("Kafka: _TRANSPORT", "cannot reach Kafka at b:9092; is the cluster up?",
                 "a Kafka call to b:9092 failed: _TRANSPORT; check kafka.bootstrap_servers, "
                 "and that the cluster is up"):
        assert logs.with_kafka_refusal(line) == logs.refused_login() == (
            "Kafka at b:9092,c:9092 refused this process's credentials: SASL authentication "
            "error: Authentication failed; check kafka.sasl_username and its password "
            "(kafka.sasl_password, or CDC_ROUTER__KAFKA__SASL_PASSWORD), kafka.sasl_mechanism "
            "and kafka.security_protocol against the broker's listener; a restart does not "
            "mend it")
    said = "SASL authentication error: Authentication failed"
    assert logs.with_kafka_refusal(said) == said
    # Review 32-3: never on a line about something else; a missing client certificate is
    # TLS's ("client SSL authentication might be required"), and the newest line counts.
    assert logs.with_kafka_refusal("cannot connect to PostgreSQL") == \
        "cannot connect to PostgreSQL"
    logs.librdkafka_logger().error("SSL handshake failed: ... client SSL authentication might "
                                   "be required (see ssl.key.location)")
    assert "(the TLS handshake with Kafka failed: SSL handshake failed" in \
        logs.with_kafka_refusal("Kafka: _TRANSPORT")
    # QA 35-e F7: a mechanism the broker does not enable ended as a bare timeout.
    logs.librdkafka_logger().error("SASL SCRAM-SHA-256 mechanism handshake failed: Broker: "
                                   "Unsupported SASL mechanism: broker's supported mechanisms: "
                                   "PLAIN,SCRAM-SHA-512")
    assert logs.with_kafka_refusal("Kafka: _TIMED_OUT").startswith(
        "Kafka at b:9092,c:9092 does not enable this process's SASL mechanism: SASL SCRAM")
    assert logs.with_kafka_refusal("Kafka: _TIMED_OUT").endswith(
        "broker's supported mechanisms: PLAIN,SCRAM-SHA-512; set kafka.sasl_mechanism to one "
        "the broker lists; a restart does not mend it")
    stale = logs._REFUSALS[0]
    monkeypatch.setattr(logs, "_REFUSALS", [(stale[0] - logs.REFUSAL_FRESH_S - 1, *stale[1:])])
    assert logs.with_kafka_refusal("Kafka: _TRANSPORT") == "Kafka: _TRANSPORT"


def test_a_failed_tls_handshake_is_named_in_a_line_that_blamed_reachability(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # QA 32-d: a wrong CA file, a certificate for another host, SSL against a plaintext
    # listener all ended as "is the cluster reachable?". Here: a listener that speaks no TLS.
    import socket
    import threading

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from cdc_router.kafka import logs

    monkeypatch.setattr(logs, "_REFUSALS", [])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def answer_in_plain_text() -> None:
        for _ in range(3):
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 50)

    threading.Thread(target=answer_in_plain_text, daemon=True).start()
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{listener.getsockname()[1]}",
                         "security.protocol": "SSL", "logger": logs.librdkafka_logger()})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    logs.serve_logs(admin)
    listener.close()
    line = logs.with_kafka_refusal("cannot reach Kafka at X; is the cluster up?")
    assert "(the TLS handshake with Kafka failed: " in line and "SSL routines" in line, line
    assert "kafka.security_protocol (now " in line and ") against the listener" in line


def test_a_refused_certificate_is_added_to_a_kafka_line_not_put_in_its_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Reread 56-s F-1: once a certificate refusal was noted, every Kafka line for 300 s was
    # replaced by it, "a restart does not mend it" included, even a mid-stream commit's
    # timeout whose process then exits 75; the line's own cause is kept now.
    from cdc_router.kafka import logs

    monkeypatch.setattr(logs, "_REFUSALS", [])
    logs.librdkafka_logger().error("SSL handshake failed: error:0A000086:SSL routines::"
                                   "certificate verify failed: broker certificate could not be "
                                   "verified")
    line = logs.with_kafka_refusal("Kafka transaction step 'commit' still fails: _TIMED_OUT")
    assert line.startswith("Kafka transaction step 'commit' still fails: _TIMED_OUT (the TLS "
                           "handshake with Kafka failed: SSL handshake failed"), line
    assert "kafka.config ssl.ca.location is not the CA that signs it" in line, line
    assert "a restart does not mend it" not in line, line
    # A start's verdict (kafka/start.py init_failure) still says it.
    assert logs.refused_certificate()
