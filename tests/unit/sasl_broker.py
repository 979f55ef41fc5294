"""A listener that speaks just enough of Kafka's protocol to refuse SASL credentials, as a
broker does for a wrong password: librdkafka's real clients meet a real refusal, with no broker.

It answers ApiVersions (SaslHandshake and SaslAuthenticate only), takes any mechanism in
SaslHandshake, and answers every SaslAuthenticate with SASL_AUTHENTICATION_FAILED (58).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 18, 17, 36
REFUSAL = "Authentication failed: Invalid username or password"


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _answer(api_key: int, version: int, request: bytes) -> bytes:
    if api_key == _API_VERSIONS:
        keys = [(_API_VERSIONS, 0, 3), (_SASL_HANDSHAKE, 0, 1), (_SASL_AUTHENTICATE, 0, 0)]
        if version >= 3:  # a flexible body: compact array, tagged fields
            return (struct.pack(">hB", 0, len(keys) + 1)
                    + b"".join(struct.pack(">hhhB", *key, 0) for key in keys)
                    + struct.pack(">iB", 0, 0))
        body = struct.pack(">hi", 0, len(keys)) + b"".join(struct.pack(">hhh", *k) for k in keys)
        return body + (struct.pack(">i", 0) if version >= 1 else b"")
    if api_key == _SASL_HANDSHAKE:
        length = struct.unpack(">h", request[:2])[0]  # the mechanism asked for, taken
        return struct.pack(">hi", 0, 1) + _string(request[2:2 + length].decode())
    return struct.pack(">h", 58) + _string(REFUSAL) + struct.pack(">i", 0)


def _serve(connection: socket.socket) -> None:
    with connection, suppress(OSError, struct.error):
        while True:
            head = connection.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return
            size = struct.unpack(">i", head)[0]
            request = connection.recv(size, socket.MSG_WAITALL)
            api_key, version, correlation = struct.unpack(">hhi", request[:8])
            client_length = struct.unpack(">h", request[8:10])[0]
            body = request[10 + max(client_length, 0):]
            if api_key == _API_VERSIONS and version >= 3:
                body = body[1:]  # the request header's tagged fields
            answer = struct.pack(">i", correlation) + _answer(api_key, version, body)
            connection.sendall(struct.pack(">i", len(answer)) + answer)


@contextmanager
def listening(serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """'127.0.0.1:<port>' of a listener that hands each connection to `serve` on a thread of
    its own, while open."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@contextmanager
def refusing_broker() -> Iterator[str]:
    """'127.0.0.1:<port>' of a SASL listener that refuses every credential, while open."""
    with listening(_serve) as address:
        yield address
