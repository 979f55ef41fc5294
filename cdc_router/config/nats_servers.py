"""The one rule for a NATS URL: the router's `nats.url` and the JetStream consumer's `url`.

nats-py reads a server whose scheme it does not know (`http://h:4222`, `nat://`, `NATS://`) as
the host `http`, port 4222, and then fails with a DNS error that names neither the URL nor its
scheme (QA 61-b F3); a path after `nats//` was read the same way (review 47-c F1).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from cdc_router.config.redact import shown_url
from cdc_router.errors import show

# nats-py's own spellings: it matches them case-sensitively in the URL's text.
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
_FORM = "each server is [nats|tls|ws|wss://][user:password@]host[:port], comma-separated"


def server_problem(url: str, tls: bool) -> tuple[str, str] | None:
    """Why `url` (comma-separated servers) is no URL nats-py reads as meant, and the server at
    fault with its password masked; None when each server is fine. `tls`: TLS options are
    given, which nats-py never applies to a plain ws:// server."""
    kinds: dict[bool, str] = {}  # WebSocket or not -> the first such server
    for server in (part.strip() for part in url.split(",")):
        scheme = server.split("://", 1)[0] if "://" in server else "nats"
        kinds.setdefault(scheme in ("ws", "wss"), server)
        if scheme not in NATS_SCHEMES:
            case = f"write it in lower case, {scheme.lower()}:// (nats-py reads " \
                f"{show(scheme, 40)}:// as a host name); " if scheme.lower() in NATS_SCHEMES else ""
            return (f"scheme {show(scheme, 40)} is not one nats-py speaks (nats://, tls://, ws://, "
                    "wss://); " + case + _FORM, shown_url(server))
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        try:
            parts.port  # noqa: B018 (raises ValueError for a port that is no number)
            # A path only behind a WebSocket proxy (review 47-c F1: `nats//host:4222` read as
            # the host "nats", the rest a path, retried as an outage for ever).
            usable = bool(parts.hostname) and (parts.path in ("", "/") or scheme in ("ws", "wss"))
        except ValueError:
            usable = False
        if not usable:
            return _FORM, shown_url(server)
        # nats-py upgrades a nats:// connection when the server asks (require_tls checks it
        # does) but never a WebSocket: over ws:// the credentials would go in clear.
        if tls and scheme == "ws":
            return ("ws:// is plain text, and nats-py never upgrades it to TLS, so the TLS "
                    "settings would not apply and the credentials would go in clear; use "
                    "wss://", shown_url(server))
    if len(kinds) == 2:  # review 61-w W-9: nats-py refused it only at connect
        return ("mixes WebSocket servers (ws://, wss://) with NATS ones (nats://, tls://), "
                "which nats-py refuses ('mixing of websocket and non websocket URLs is not "
                "allowed'); list servers of one kind only", ",".join(
                    shown_url(kinds[websocket]) for websocket in (False, True)))
    return None
