"""The consumer README against the code it describes (review 52-c F-low-4, F-low-10, F-low-12)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cdc_router.consumer import ConsumerSettings

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "cdc_router" / "consumer" / "README.md").read_text()
MANUAL = (ROOT / "README.md").read_text()


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def test_the_first_snippet_creates_what_it_needs_and_stops_gracefully() -> None:
    # F-low-12: copied as written it stopped on a missing dead-letter topic, had no shipments
    # table, and Ctrl-C was a KeyboardInterrupt traceback.
    snippet = blocks(GUIDE, "python")[0]
    ast.parse(snippet)
    [topic] = re.findall(r'dead_letter_topic="([^"]+)"', snippet)
    shell = GUIDE[:GUIDE.index(snippet)]
    assert re.search(rf"kafka-topics\.sh --bootstrap-server \S+ --create --topic {topic}\b",
                     shell)
    assert "CREATE TABLE shipments" in shell
    assert all(column in shell for column in ("order_id", "event_id", "amount"))
    assert "signal.signal(" in snippet and "consumer.stop()" in snippet
    # QA 57-c F-6: a start-up error (a wrong DSN, a missing dedup table) was a traceback.
    tree = ast.parse(snippet)
    [guard] = [node for node in tree.body if isinstance(node, ast.Try)]
    assert [ast.unparse(handler.type) for handler in guard.handlers if handler.type
            ] == ["CdcRouterError"]
    inside = ast.unparse(ast.Module(body=guard.body, type_ignores=[]))
    assert all(call in inside for call in ("ConsumerSettings(", "PostgresDedupStore(",
                                           "ensure_schema()", "consumer.run()"))
    assert "sys.exit(error.exit_code)" in snippet


def test_where_a_new_group_or_durable_starts_is_said() -> None:
    # F-low-10: a new group reads from the topics' beginning; nothing said so.
    settings = ConsumerSettings(bootstrap_servers="b:9092", group_id="g", topics=("t",),
                                dead_letter_topic="t.dlq")
    reset = settings.librdkafka_consumer()["auto.offset.reset"]
    assert f"`auto.offset.reset={reset}`" in GUIDE
    assert 'consumer_config={"auto.offset.reset": "latest"}' in GUIDE
    assert "`DeliverPolicy` all" in GUIDE and "DeliverPolicy.NEW" in GUIDE


def test_the_partition_assignor_is_said() -> None:
    # Low 57: neither README said which assignor the consumer uses (none set: librdkafka's
    # eager default), how to choose cooperative-sticky, nor that a group switches at once.
    settings = ConsumerSettings(bootstrap_servers="b:9092", group_id="g", topics=("t",),
                                dead_letter_topic="t.dlq")
    assert "partition.assignment.strategy" not in settings.librdkafka_consumer()
    said = " ".join(GUIDE.split())  # as read, whatever the line breaks
    assert "default holds: `range,roundrobin`, eager" in said
    assert 'consumer_config={"partition.assignment.strategy": "cooperative-sticky"}' in said
    # Fixer 57-y N-3: a refused member stops (it warned every 2 s for ever).
    assert "(`INCONSISTENT_GROUP_PROTOCOL`): its `run()` raises `FatalKafkaError` at once" in said



    # F-low-4: a batch handled for longer than max.poll.interval.ms is redone whole.
    default = ConsumerSettings.__dataclass_fields__["batch_size"].default
    assert f"A batch of up to `batch_size` records ({default})" in GUIDE
    assert "`batch_size` x the slowest handler time must stay well\nunder librdkafka's " \
           "`max.poll.interval.ms`" in GUIDE


def test_the_manuals_jetstream_snippet_decodes_with_parse_json() -> None:
    # F-low-12: it used json.loads, which takes a BOM, UTF-16 and UTF-32.
    [snippet] = [block for block in blocks(MANUAL, "python") if "JetStreamConsumer(" in block]
    assert "decoder=parse_json" in snippet and "decoder=json.loads" not in snippet
    assert "from cdc_router.serde.json import parse_json" in snippet
