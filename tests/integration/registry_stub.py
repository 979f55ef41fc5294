"""A stand-in for a Confluent schema registry: the REST subset our code uses, over real HTTP.

No Confluent-compatible registry can be installed from the package registries this machine
reaches (Karapace is not on PyPI; Apicurio's app needs artifacts Maven Central does not serve;
Confluent's own is not on Maven Central). This stub lets the router process, its real HTTP
client (confluent-kafka's SchemaRegistryClient) and the CLI talk to a registry over the wire.
It keeps the semantics they rely on: ids shared by equal schemas across subjects, versions per
subject, lookups by Parsing Canonical Form, BACKWARD compatibility (Apache Avro's checker) on
register and on /compatibility, Confluent's error codes. docker/docker-compose.yml runs the
real Confluent registry (profile `registry`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from cdc_router.serde.avro_schema import parse_schema_text
from cdc_router.serde.compatibility import backward_incompatibilities

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@dataclass
class RegistryState:
    """Schemas by id, and each subject's versions (schema ids, oldest first)."""

    schemas: dict[int, str] = field(default_factory=dict)
    canonical_ids: dict[str, int] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def canonical(self, text: str) -> str:
        return parse_schema_text(text, "request").canonical

    def compatible(self, subject: str, text: str) -> bool:
        versions = self.subjects.get(subject) or []
        if not versions:
            return True
        new = parse_schema_text(text, "request")
        return not backward_incompatibilities(new, self.schemas[versions[-1]])


class _Handler(BaseHTTPRequestHandler):
    state: RegistryState

    def log_message(self, format: str, *args: Any) -> None:  # the base's signature
        """Quiet: pytest shows what matters."""

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: int, message: str) -> None:
        self._reply(status, {"error_code": code, "message": message})

    def _path(self) -> list[str]:
        return [unquote(part) for part in urlsplit(self.path).path.strip("/").split("/")]

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        return body

    def do_GET(self) -> None:
        parts, state = self._path(), self.state
        with state.lock:
            if parts == ["subjects"]:
                return self._reply(200, sorted(state.subjects))
            if len(parts) == 3 and parts[:2] == ["schemas", "ids"]:
                text = state.schemas.get(int(parts[2]))
                if text is None:
                    return self._error(404, 40403, "Schema not found")
                return self._reply(200, {"schema": text})
            if len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
                versions = state.subjects.get(parts[1])
                if not versions:
                    return self._error(404, 40401, f"Subject '{parts[1]}' not found.")
                index = len(versions) - 1 if parts[3] == "latest" else int(parts[3]) - 1
                schema_id = versions[index]
                return self._reply(200, {"subject": parts[1], "version": index + 1,
                                         "id": schema_id, "schema": state.schemas[schema_id]})
        return self._error(404, 404, f"no route for GET {self.path}")

    def do_POST(self) -> None:
        parts, state, body = self._path(), self.state, self._body()
        text = body.get("schema", "")
        if body.get("schemaType", "AVRO") != "AVRO":
            return self._error(422, 42201, "only AVRO here")
        try:
            canonical = state.canonical(text)
        except Exception as error:  # any parse failure is the client's
            return self._error(422, 42201, f"Invalid schema: {error}")
        with state.lock:
            if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
                return self._register(parts[1], text, canonical)
            if len(parts) == 2 and parts[0] == "subjects":
                versions = state.subjects.get(parts[1])
                if not versions:
                    return self._error(404, 40401, f"Subject '{parts[1]}' not found.")
                schema_id = state.canonical_ids.get(canonical)
                if schema_id not in versions:
                    return self._error(404, 40403, "Schema not found")
                return self._reply(200, {"subject": parts[1], "id": schema_id,
                                         "version": versions.index(schema_id) + 1,
                                         "schema": state.schemas[schema_id]})
            if parts[:2] == ["compatibility", "subjects"] and len(parts) == 5:
                if not state.subjects.get(parts[2]):
                    return self._error(404, 40401, f"Subject '{parts[2]}' not found.")
                return self._reply(200, {"is_compatible": state.compatible(parts[2], text)})
        return self._error(404, 404, f"no route for POST {self.path}")

    def _register(self, subject: str, text: str, canonical: str) -> None:
        state = self.state
        versions = state.subjects.setdefault(subject, [])
        known = state.canonical_ids.get(canonical)
        if known is not None and known in versions:
            return self._reply(200, {"id": known})
        if not state.compatible(subject, text):
            return self._error(409, 409, "Schema being registered is incompatible with an "
                               f"earlier schema for subject {subject!r}")
        if known is None:
            known = len(state.schemas) + 1
            state.schemas[known] = text
            state.canonical_ids[canonical] = known
        versions.append(known)
        return self._reply(200, {"id": known})


@dataclass(frozen=True)
class RegistryStub:
    url: str
    state: RegistryState


@contextmanager
def registry_stub(*, port: int = 0, state: RegistryState | None = None
                  ) -> Iterator[RegistryStub]:
    """Serve a registry on a loopback port while the block runs: a fresh one on a free port,
    or, given `port` and `state`, the one a previous block served (a registry back up)."""
    state = state or RegistryState()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, name="registry-stub", daemon=True)
    thread.start()
    try:
        yield RegistryStub(f"http://127.0.0.1:{server.server_address[1]}", state)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
