"""The registry subjects a config's Avro routes plan, and the conflict a config can have there.

Under subject_name_strategy topic a topic has one subject: two different schemas planned for
one topic (a route with a schema per event type) would be two versions of it, which a registry
at any compatibility level but NONE refuses, the second after the first is registered (QA 53-b
F1: `schemas register` registered one and failed on the other; `run` then stopped, sending the
user back to `schemas register`). Every command checks it the same way, before the registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cdc_router.serde.avro_schema import AvroSchema


@dataclass(frozen=True)
class PlannedSubject:
    """One (route, event type, schema) and, when known before any event, its topic and subject.

    The topic is known when the route's topic template is a plain name, or uses only {type}
    and the schema is mapped to an event type; the subject also needs no topic under the
    record strategy. None: it depends on the event.
    """

    route: int
    event_type: str | None  # None: the route's one schema, for any type
    schema: AvroSchema
    topic: str | None
    subject: str | None


def shared_subjects(planned: Iterable[PlannedSubject]) -> dict[str, str]:
    """The subjects that several different schemas are planned under, each with the problem
    line every command gives (in the order first planned)."""
    schemas: dict[str, set[str]] = {}
    for entry in planned:
        if entry.subject is not None:
            schemas.setdefault(entry.subject, set()).add(entry.schema.canonical)
    return {subject: f"several schemas share subject {subject}: use subject_name_strategy "
                     "record or topic_record for a topic that carries several event types"
            for subject, texts in schemas.items() if len(texts) > 1}
