"""serde/registry_answers.py: a subject's refusal remembered for a while, slow lookups logged
(QA 55-c F-2: a registry answering in 4 s let one event through every 4 s)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

from cdc_router.config.routes import RouteRule
from cdc_router.errors import EXIT_RESTART, SerializeError
from cdc_router.serde import registry_answers
from cdc_router.serde.avro import AvroSerializer
from cdc_router.serde.avro_schema import load_schema
from cdc_router.serde.registry import RegistryError
from cdc_router.serde.registry_answers import SlowLookups
from cdc_router.serde.registry_failures import OUTAGE, registry_failure
from tests.unit.test_avro import GOOD, PAYMENT, MockRegistry, event, registry

DYNAMIC = RouteRule.model_validate({"topic": "x.{aggregate_id}", "format": "avro",
                                    "schema": str(PAYMENT)})


class CountingRegistry(MockRegistry):  # type: ignore[misc,valid-type]
    """The in-memory registry, answering `refusal` (if set) to each lookup, which it counts."""

    refusal: Exception | None = None
    lookups = 0

    def lookup_schema(self, *args: Any, **kwargs: Any) -> Any:
        self.lookups += 1
        if self.refusal is not None:
            raise self.refusal
        return super().lookup_schema(*args, **kwargs)


def _serializer(refusal: Exception | None) -> tuple[CountingRegistry, AvroSerializer]:
    client = CountingRegistry({"url": "mock://counting"})
    client.refusal = refusal
    return client, AvroSerializer([DYNAMIC], registry(), registry_client=client)


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lookup counts as slow (the in-memory registry answers at once)."""
    monkeypatch.setattr(registry_answers, "SLOW_LOOKUP_S", 0.0)


def test_a_missing_data_named_subject_is_asked_once_for_the_events_that_follow(
        slow: None) -> None:
    client, serializer = _serializer(None)  # the in-memory registry lacks the subject
    reasons = []
    for _ in range(5):
        with pytest.raises(SerializeError) as caught:
            serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
        reasons.append(str(caught.value))
    assert client.lookups == 1  # each event asked the registry again on the old code
    assert len(set(reasons)) == 1 and "subject 'x.n01-value': not registered" in reasons[0]
    assert "dlq replay" in reasons[0]
    with pytest.raises(SerializeError):  # another subject is asked on its own
        serializer.serialize(event(GOOD), DYNAMIC, "x.n02")
    assert client.lookups == 2


def test_a_refusal_is_asked_again_once_its_memory_is_over(monkeypatch: pytest.MonkeyPatch,
                                                          slow: None) -> None:
    monkeypatch.setattr(registry_answers, "REFUSAL_MEMORY_S", 0.0)
    client, serializer = _serializer(None)  # missing
    for _ in range(3):
        with pytest.raises(SerializeError):
            serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
    assert client.lookups == 3


@pytest.mark.parametrize("refusal", [ClientError(403, 0, "Forbidden"),
                                     ClientError(403, 40301, "User is denied operation"),
                                     ClientError(422, 42201, "Invalid schema")])
def test_a_definite_refusal_other_than_missing_or_incompatible_is_not_remembered(
        slow: None, refusal: Exception) -> None:
    # Reread 55-r F-6: a 403 from an auth proxy or a token refresh's hiccup dead-lettered
    # every event of the subject for 10 s; each event now asks, as before QA 55-c F-2.
    client, serializer = _serializer(refusal)
    for _ in range(3):
        with pytest.raises(SerializeError, match="dlq replay"):
            serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
    assert client.lookups == 3
    client.refusal = None  # the refusal passed: the next event is asked, and lacks the subject
    with pytest.raises(SerializeError, match="not registered"):
        serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
    assert client.lookups == 4


def test_a_remembered_refusal_still_names_a_payload_that_does_not_fit(slow: None) -> None:
    _, serializer = _serializer(None)
    with pytest.raises(SerializeError):
        serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
    bad = {**GOOD, "amount_cents": "x"}  # its own fault, named as before
    with pytest.raises(SerializeError, match="amount_cents"):
        serializer.serialize(event(bad), DYNAMIC, "x.n01")


@pytest.mark.parametrize("outage", [ClientError(503, 50301, "Service Unavailable"),
                                    ConnectionRefusedError(111, "Connection refused")])
def test_an_outage_is_never_remembered_and_never_a_dead_letter(outage: Exception) -> None:
    client, serializer = _serializer(outage)
    for _ in range(2):
        with pytest.raises(RegistryError) as caught:
            serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
        assert not isinstance(caught.value, SerializeError)
        assert caught.value.exit_code == EXIT_RESTART
    assert client.lookups == 2


def test_a_slow_lookup_is_logged_with_the_url_at_most_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def lookup(seconds: float) -> str:
        now[0] += seconds
        return "id"

    slow = SlowLookups(clock)
    url = "http://user:secret@registry:8081"
    with caplog.at_level(logging.WARNING, logger="cdc_router.serde.registry"):
        assert slow.timed(url, "look up x", lambda: lookup(0.2)) == "id"  # fast: nothing
        slow.timed(url, "look up x", lambda: lookup(4.0))
        slow.timed(url, "look up y", lambda: lookup(2.0))  # within the minute: counted
        now[0] += 60
        slow.timed(url, "look up z", lambda: lookup(1.5))
        with pytest.raises(ValueError):  # a failed lookup is timed too
            slow.timed(url, "look up w", lambda: (lookup(9.0), _fail())[0])
    lines = [r.getMessage() for r in caplog.records if "event=registry_slow" in r.getMessage()]
    assert len(lines) == 2
    assert "seconds=4.0" in lines[0] and "slow_lookups=1" in lines[0]
    assert "seconds=1.5" in lines[1] and "slow_lookups=2" in lines[1] and "worst_s=2.0" in lines[1]
    assert "registry:8081" in lines[0] and "secret" not in caplog.text


def _fail() -> None:
    raise ValueError("boom")


def test_the_serializers_lookups_are_timed_until_the_subject_is_found(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(registry_answers, "SLOW_LOOKUP_S", 0.0)  # every lookup counts as slow
    monkeypatch.setattr("cdc_router.serde.registry.SLOW", SlowLookups())
    _, serializer = _serializer(None)
    with caplog.at_level(logging.WARNING, logger="cdc_router.serde.registry"), \
            pytest.raises(SerializeError):
        serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
    assert "event=registry_slow url=mock://unit" in caplog.text
    assert "x.n01" in caplog.text


@pytest.mark.parametrize(("error", "said"), [
    (ClientError(503, 503, "injected"), "answered HTTP 503 (injected"),
    (ClientError(502, -1, "Unknown Schema Registry Error: b'<urlopen error [Errno 111] "
                 "Connection refused>'"), "answered HTTP 502 (Unknown Schema Registry Error"),
    (ClientError(429, 42901, "Too many requests"), "answered HTTP 429"),
    (json.JSONDecodeError("Expecting value", "<html>", 0),
     "answered with a body that is not JSON (JSONDecodeError: Expecting value"),
    (ConnectionRefusedError(111, "Connection refused"), "did not answer (ConnectionRefusedError"),
])
def test_every_outage_names_the_registry_and_says_it_is_one(error: Exception, said: str) -> None:
    # QA 55-c F-4: a 503 read "cannot list the subjects: injected (HTTP status code 503, SR
    # code 503)", naming neither the registry nor an outage; a 200 with a non-JSON body "did
    # not answer".
    failure = registry_failure("list the subjects", error, "http://user:secret@sr:8081")
    text = str(failure)
    assert text.startswith("cannot list the subjects: the schema registry at "
                           "http://user:*****@sr:8081 "), text
    assert said in text and "secret" not in text
    assert text.endswith(f"; {OUTAGE}")
    assert failure.exit_code == EXIT_RESTART and not failure.refused


def test_a_registry_that_does_not_answer_names_the_setting_that_holds_its_address() -> None:
    # QA 62-b: `schema_registry.url: http://schema-registry:8081` (the docker name) run on
    # the local stack without CDC_ROUTER__SCHEMA_REGISTRY__URL: "did not answer (ConnectError:
    # [Errno -2] Name or service not known); an outage", and exit 75 at every restart,
    # naming no setting.
    failure = registry_failure("list the subjects", OSError(
        -2, "Name or service not known"), "http://schema-registry:8081")
    text = str(failure)
    assert "check schema_registry.url (its host and port; CDC_ROUTER__SCHEMA_REGISTRY__URL " \
        "overrides it)" in text, text
    assert text.endswith(f"; {OUTAGE}") and failure.exit_code == EXIT_RESTART


def test_an_incompatible_schema_points_at_a_field_or_the_subjects_other_type() -> None:
    # QA 60-b F-2: a subject holding another type of schema (a string, the route's a record)
    # has no field to name: `schemas check` says which type it holds.
    failure = registry_failure("register o.avsc under subject 'x-value'", ClientError(
        409, 409, "Schema being registered is incompatible"), "http://sr:8081")
    # Review 63: "so that it reads them" was BACKWARD's advice alone; FORWARD is the other way.
    assert "the subject's compatibility level takes it (BACKWARD, the default: it reads them, " \
        "a default for each new field; FORWARD: they read it; " in str(failure), str(failure)
    assert failure.incompatible and str(failure).endswith(
        "`cdc-router schemas check -c ...` names the field, or "
        "the other type of schema the subject holds)")


# Confluent Schema Registry 7.x's 409: the details name the field, the old version and the
# level, and quote the old schema whole.
CONFLUENT_409 = (
    "Schema being registered is incompatible with an earlier schema for subject "
    "\"inv.Note-value\", details: [{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', "
    "description:'The field 'warehouse' at path '/fields/3' in the new schema has no default "
    "value and is missing in the old schema', additionalInfo:'warehouse'}, "
    "{oldSchemaVersion: 3}, {oldSchema: '{\"type\":\"record\",\"name\":\"OrderPaid\","
    "\"fields\":[" + ",".join(f'{{\"name\":\"f{i}\",\"type\":\"string\"}}'
                              for i in range(200)) + "]}'}, "
    "{validateFields: 'false', compatibility: 'BACKWARD'}]")


@pytest.mark.parametrize(("said", "kept", "left_out"), [
    (CONFLUENT_409, ["subject \"inv.Note-value\"", "The field 'warehouse' at path '/fields/3'",
                     "{oldSchemaVersion: 3}", "compatibility: 'BACKWARD'"], ['"type"', "f199"]),
    ("io.apicurio.registry.rules.RuleViolationException: Incompatible artifact: inv.Note-value "
     "[AVRO], num of incompatible diffs: {1}, list of diff types: [n at /fields/0]",
     ["Incompatible artifact: inv.Note-value [AVRO]", "[n at /fields/0]"], ["io.apicurio"]),
])
def test_an_incompatible_schemas_reason_quotes_the_registrys_words(
        said: str, kept: list[str], left_out: list[str]) -> None:
    # QA 63-a: the dead letter of an event whose data-named subject refused the route's schema
    # (and the start's error for a known subject) said "incompatible with the subject's
    # registered versions", dropping the registry's answer that names the field, the version
    # and the level.
    failure = registry_failure("register inv.avsc under subject 'inv.Note-value'",
                               ClientError(409, 409, said), "http://sr:8081")
    text = str(failure)
    assert failure.incompatible and "\n" not in text
    for words in kept:
        assert words in text, text
    for words in left_out:
        assert words not in text, text
    assert len(text) < 900, text


def test_a_subject_registered_at_run_time_is_logged_once(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    # QA 55-c F-8: with auto_register, the first event of a data-named subject registered it
    # through confluent-kafka's serializer, and no event=schema_registered line said so.
    client = CountingRegistry({"url": "mock://registering"})
    serializer = AvroSerializer([DYNAMIC], registry(auto_register=True), registry_client=client)
    with caplog.at_level(logging.INFO, logger="cdc_router.serde.registry"):
        for _ in range(3):
            serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
        serializer.serialize(event(GOOD), DYNAMIC, "x.n02")
    registered = [r.getMessage() for r in caplog.records
                  if "event=schema_registered" in r.getMessage()]
    assert [line.split()[1] for line in registered] == ["subject=x.n01-value",
                                                        "subject=x.n02-value"]
    assert sorted(client.get_subjects()) == ["x.n01-value", "x.n02-value"]
    # Known since: found, not registered again.
    again = AvroSerializer([DYNAMIC], registry(auto_register=True), registry_client=client)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cdc_router.serde.registry"):
        again.serialize(event(GOOD), DYNAMIC, "x.n01")
    assert "event=schema_registered" not in caplog.text
    assert "event=schema_found subject=x.n01-value" in caplog.text


def test_a_quick_refusal_is_not_remembered_and_a_registration_is_used_at_once() -> None:
    # The CI rehearsal at 6eff9ba: `schemas register --subject` and then the next event of
    # that subject was still dead-lettered from the memory; a registry that answers in
    # milliseconds is asked again instead.
    client, serializer = _serializer(None)
    for _ in range(3):
        with pytest.raises(SerializeError, match="not registered"):
            serializer.serialize(event(GOOD), DYNAMIC, "x.n01")
    assert client.lookups == 3
    client.register_schema("x.n01-value", Schema(load_schema(PAYMENT).text, "AVRO"))
    assert serializer.serialize(event(GOOD), DYNAMIC, "x.n01")[:1] == b"\x00"


PROXY_PAGE = "Unknown Schema Registry Error: b'<!DOCTYPE html>\\n<html><head><title>" + \
    "x" * 5000 + "</title></head></html>'"


def test_a_proxys_bare_4xx_is_one_short_line_and_a_407_names_the_proxy_credentials() -> None:
    # rv66: a proxy's 407 (or 403/404 page) before the registry: confluent-kafka's client puts
    # the whole HTML body in the message; the consumer ends run() with it (exit 1).
    url = "http://user:secret@sr:8081"
    failure = registry_failure("look up schema id 1", ClientError(407, -1, PROXY_PAGE), url)
    text = str(failure)
    assert text == ("cannot look up schema id 1: an HTTP proxy on the way to the schema "
                    "registry at http://user:*****@sr:8081 wants credentials of its own (HTTP "
                    "407 Proxy Authentication Required): give them in the proxy variable "
                    "(HTTPS_PROXY, or HTTP_PROXY for an http:// registry: "
                    "http://USER:PASSWORD@HOST:PORT), or name the registry's host in NO_PROXY")
    assert not failure.refused and failure.exit_code == 1  # no retry mends it
    page = str(registry_failure("look up schema id 1", ClientError(404, -1, PROXY_PAGE), url))
    assert page.startswith("cannot look up schema id 1: HTTP 404 from http://user:*****@sr:8081 "
                           "(Unknown Schema Registry Error: b'<!DOCTYPE html>"), page
    assert len(page) < 500 and "\n" not in page and "secret" not in page, page
    assert page.endswith("that answer has no schema registry error code: is "
                         "schema_registry.url the registry's (Apicurio: its /apis/ccompat/v7 "
                         "path), and does a proxy on the way let it through?")
