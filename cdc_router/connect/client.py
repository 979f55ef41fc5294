"""A small, synchronous Kafka Connect REST client.

Every failure is a ConnectError whose str() is one line: Connect unreachable (with the URL),
an unknown connector (with its name), or Connect's status code and `message`.
"""

from __future__ import annotations

import builtins
import logging
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from cdc_router.config.redact import shown_url, user_info_problem
from cdc_router.connect.status import ConnectorStatus
from cdc_router.errors import (
    ConnectError,
    ConnectNotServingError,
    UnknownConnectorError,
    on_one_line,
)

log = logging.getLogger("cdc_router.connect")

# Connect's REST server gives a forwarded request (PUT config, restart, validate) up to 90 s
# (ConnectResource's request timeout) before it answers 500 itself; reading a little longer
# lets the user see Connect's own message instead of our guess. Connecting is a plain TCP
# handshake: if it takes more than a few seconds, the worker is not there.
DEFAULT_TIMEOUT = httpx.Timeout(100.0, connect=5.0)
# A GET (a status, a config, the list) is answered from the worker's memory, not forwarded;
# a config or the list waits for the herder's thread (a rebalance, a connector's start hold it
# for seconds). 30 s without an answer is a stuck worker (stopped, in a GC pause), to be heard
# of sooner than 100 s (review 48-b F8); `status`'s probe takes 10 s (ops/connector.py).
READ_TIMEOUT = httpx.Timeout(30.0, connect=3.0)

# A 409, or a 500 "a rebalance is expected" (Connect maps its RebalanceNeededException to no
# code), is a rebalance or config write in flight, settled in seconds: retried, bounded.
_CONFLICT_RETRIES = 8
_CONFLICT_BACKOFF_S = 1.0
# A host name no resolver knows is polled for the first 30 s of a wait, then fatal (review 65):
# Docker's embedded DNS drops a stopped container's name until it starts again (a restart:
# `docker stop`'s 10 s grace, then the start), and a StatefulSet pod's name behind a headless
# service is gone while the pod is not ready. A mistyped --url is said at once all the same.
# `connectors wait --name-grace` sets it: a Connect pod's start takes 40-90 s (review 66).
NAME_GRACE_S = 30.0


class UnresolvedHostError(ConnectError):
    """The URL's host name does not resolve (EAI_NONAME): a wrong URL, or a worker whose
    name is gone while it restarts."""


@dataclass(frozen=True)
class Validation:
    """Connect's verdict on a config: per-field error messages, empty when valid."""

    errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


class ConnectClient:
    """Kafka Connect REST API; constructing it makes no network call."""

    def __init__(self, url: str, *, auth: tuple[str, str] | None = None,
                 timeout: httpx.Timeout = DEFAULT_TIMEOUT,
                 read_timeout: httpx.Timeout = READ_TIMEOUT,
                 transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url.rstrip("/")
        self._shown = shown_url(self.url)  # httpx takes user:password@ in it as basic auth
        self._auth = httpx.BasicAuth(*auth) if auth else None
        self._timeout = timeout  # of the writes; a GET has `read_timeout`
        self._read_timeout = read_timeout
        self._transport = transport
        self._sleep = sleep
        self._clock = clock
        self._http: httpx.Client | None = None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> ConnectClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reads ----------------------------------------------------------------------------

    def list(self) -> list[str]:
        """Names of the deployed connectors, sorted."""
        names = self._json("GET", "/connectors", list)
        if not all(isinstance(name, str) for name in names):
            raise self._not_connect("GET", "/connectors", "a list of names")
        return sorted(names)

    def list_statuses(self) -> builtins.list[ConnectorStatus]:
        """Every connector's status in one call (GET /connectors?expand=status)."""
        data = self._json("GET", "/connectors", dict, params={"expand": "status"})
        with self._shaped("GET", "/connectors?expand=status"):
            return [ConnectorStatus.from_json(item["status"]) for _, item in sorted(data.items())]

    def list_configs(self) -> dict[str, dict[str, str]]:
        """Every connector's stored config by name, in one call (GET /connectors?expand=info)."""
        data = self._json("GET", "/connectors", dict, params={"expand": "info"})
        with self._shaped("GET", "/connectors?expand=info"):
            return {name: dict(item["info"]["config"]) for name, item in sorted(data.items())}

    def get(self, name: str) -> dict[str, Any]:
        """The connector's info: name, type, config and task ids."""
        info: dict[str, Any] = self._json("GET", _path(name), dict, connector=name)
        if not isinstance(info.get("config"), dict):
            raise self._not_connect("GET", _path(name), "a connector's info")
        return info

    def get_config(self, name: str) -> dict[str, str]:
        """The connector's stored config, config-provider references unresolved."""
        config: dict[str, str] = self._json("GET", _path(name, "config"), dict, connector=name)
        return config

    def get_status(self, name: str) -> ConnectorStatus:
        data = self._json("GET", _path(name, "status"), dict, connector=name)
        with self._shaped("GET", _path(name, "status")):
            return ConnectorStatus.from_json(data)

    # -- writes ---------------------------------------------------------------------------

    def put_config(self, name: str, config: Mapping[str, str]) -> bool:
        """Create or replace the connector's whole config; True when it was created."""
        response = self._request("PUT", _path(name, "config"), json=dict(config))
        return response.status_code == httpx.codes.CREATED

    def validate(self, connector_class: str, config: Mapping[str, str]) -> Validation:
        """Ask the plugin to validate `config` (Debezium also tries the database).

        Connect insists on a `name` in the config it validates; put the connector's name in.
        """
        body = {**config, "connector.class": connector_class}
        path = f"/connector-plugins/{quote(connector_class, safe='')}/config/validate"
        try:
            data = self._json("PUT", path, dict, json=body)
        except ConnectError as error:  # review 53-c F2: a 500 with every PluginDesc on one line
            if "Failed to find any class" not in str(error):
                raise
            raise ConnectError(f"field 'config.connector.class': Kafka Connect has no connector "
                               f"{connector_class!r}: is its plugin installed on the Connect "
                               "worker?") from None
        if not isinstance(data.get("configs"), list):  # else every config would be valid
            raise self._not_connect("PUT", path, "a validation of a config")
        with self._shaped("PUT", path):
            errors = {
                str(item["value"]["name"]): tuple(item["value"]["errors"])
                for item in data["configs"] if (item.get("value") or {}).get("errors")
            }
        return Validation(errors)

    def restart(self, name: str, *, include_tasks: bool = False,
                only_failed: bool = False) -> None:
        params = {"includeTasks": str(include_tasks).lower(),
                  "onlyFailed": str(only_failed).lower()}
        self._request("POST", _path(name, "restart"), params=params, connector=name)

    def pause(self, name: str) -> None:
        self._request("PUT", _path(name, "pause"), connector=name)

    def resume(self, name: str) -> None:
        self._request("PUT", _path(name, "resume"), connector=name)

    def stop(self, name: str) -> None:
        """Shut the connector's tasks down, keeping its config (KIP-875, Kafka 3.5+)."""
        self._request("PUT", _path(name, "stop"), connector=name)

    def reset_offsets(self, name: str) -> None:
        """Forget the source offsets of a STOPPED connector (KIP-875, Kafka 3.6+): Debezium
        then starts as new, per its snapshot.mode."""
        self._request("DELETE", _path(name, "offsets"), connector=name)

    def delete(self, name: str) -> None:
        self._request("DELETE", _path(name), connector=name)

    def wait_for_state(self, name: str, state: str, timeout: float, *,
                       poll_interval: float = 1.0,
                       unanswered: Callable[[ConnectError], None] | None = None,
                       name_grace_s: float = NAME_GRACE_S) -> ConnectorStatus:
        """Poll until the connector and all its tasks are in `state`; return that status.

        Waiting for RUNNING fails at once when the connector or a task is FAILED (Connect does
        not restart failed tasks on its own). A connector unknown right after a PUT is the
        status topic catching up, and a worker that refuses connections or answers a plain
        404 one starting (QA 64-a F-8: the wait after a worker's restart failed in 4 s), so
        each is polled again until `timeout`, then said; a host name that does not resolve,
        for the first `name_grace_s` only. `unanswered` is called with the first such refusal,
        plain 404 or name: a wrong --url looks the same (review 64), so the command says it at
        once.
        """
        deadline = self._clock() + timeout
        named_until = min(deadline, self._clock() + name_grace_s)
        last: ConnectorStatus | None = None
        while True:
            try:
                last = self.get_status(name)
            except (UnknownConnectorError, ConnectNotServingError, UnresolvedHostError) as error:
                if self._clock() >= (named_until if isinstance(error, UnresolvedHostError)
                                     else deadline):
                    raise
                if unanswered is not None and not isinstance(error, UnknownConnectorError):
                    unanswered(error)
                    unanswered = None
            else:
                if last.reached(state):
                    return last
                if state == "RUNNING" and last.failure():
                    raise ConnectError(f"connector {name!r} {last.failure()}")
                if self._clock() >= deadline:
                    tasks = ", ".join(f"task {t.id} {t.state}" for t in last.tasks) or "no tasks"
                    raise ConnectError(f"connector {name!r} not {state} after {timeout:g}s "
                                       f"(connector {last.state}, {tasks})")
            self._sleep(poll_interval)

    # -- transport ------------------------------------------------------------------------

    @property
    def _client(self) -> httpx.Client:
        if self._http is None:
            if self.url != self.url.lstrip() or user_info_problem(self.url):  # QA 49-h F3, 64-b
                raise self._invalid_url(user_info_problem(self.url) or "a blank before it")
            try:
                http = httpx.Client(base_url=self.url, auth=self._auth, timeout=self._timeout,
                                    transport=self._transport,
                                    headers={"Accept": "application/json"})
            except httpx.InvalidURL as error:  # e.g. a port that is not a number
                raise self._invalid_url(str(error)) from error
            # httpx would take these for an outage at the first request: "unreachable at
            # 127.0.0.1:8083: ... missing an 'http://'" (review 46-2 F13).
            if http.base_url.scheme not in ("http", "https"):
                http.close()
                raise self._invalid_url("empty" if not self.url else
                                        "no http:// or https:// before the host"
                                        if not http.base_url.scheme else
                                        f"scheme {http.base_url.scheme}: not http or https")
            if not http.base_url.host:
                http.close()
                raise self._invalid_url("no host")
            port = http.base_url.port
            if port is not None and not 1 <= port <= 65535:  # QA 49-h F3: it probed, exit 2
                http.close()
                raise self._invalid_url(f"its port {port} is not one from 1 to 65535")
            self._http = http
        return self._http

    def _invalid_url(self, reason: str) -> ConnectError:
        return ConnectError(f"Kafka Connect URL {self._shown!r} is not valid ({reason}): give "
                            "its REST URL, e.g. http://127.0.0.1:8083 (the command's --url or "
                            "--connect-url, or CDC_ROUTER_CONNECT_URL)")

    def _request(self, method: str, path: str, *, connector: str | None = None,
                 **kwargs: Any) -> httpx.Response:
        timeout = self._read_timeout if method == "GET" else self._timeout
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                response = self._client.request(method, path, timeout=timeout, **kwargs)
            except httpx.TimeoutException as error:
                waited = timeout.connect if isinstance(error, httpx.ConnectTimeout) else \
                    timeout.read
                within = f"within {waited:g}s" if waited is not None else "in time"
                raise ConnectError(f"Kafka Connect at {self._shown} did not answer {method} {path} "
                                   f"{within} ({type(error).__name__}): is the worker stuck or "
                                   "overloaded? try again, or look at its log") from error
            except httpx.TransportError as error:
                # A name no resolver knows is the URL's fault, not a worker restarting:
                # `connectors wait` fails on it at once (review 64 of QA 64-a F-8).
                kind = UnresolvedHostError if _unknown_host(error) else ConnectNotServingError
                raise kind(f"Kafka Connect unreachable at {self._shown}: "
                           f"{on_one_line(str(error)) or type(error).__name__}") from error
            log.debug("event=connect_request method=%s path=%s status=%s attempt=%s", method,
                      path, response.status_code, attempt)
            if attempt < _CONFLICT_RETRIES and (response.status_code == httpx.codes.CONFLICT or (
                    response.is_server_error and "rebalance is expected" in response.text)):
                self._sleep(_CONFLICT_BACKOFF_S)
                continue
            break
        if response.status_code == httpx.codes.NOT_FOUND:
            # Review 48-b F16: a web server or the registry at a wrong --url answered 404, and
            # `diff` planned a create (exit 2), `status` said the connector was unknown.
            # QA 64-a F-8: a starting worker's web server answers so for seconds, too.
            if not _connects_own(response):
                raise ConnectNotServingError(
                    f"{self._shown} answered 404 to {method} {path} without Kafka Connect's "
                    "error JSON: is this Kafka Connect's REST URL (or a worker still starting)?")
            if connector is not None:
                raise UnknownConnectorError(connector, self._shown)
        if response.is_error:
            raise ConnectError(f"Kafka Connect answered {response.status_code} to {method} "
                               f"{path}: {_message(response)}")
        return response

    def _json(self, method: str, path: str, shape: type, *, connector: str | None = None,
              **kwargs: Any) -> Any:
        """The answer's JSON body, of type `shape`; a ConnectError for anything else (QA 31:
        a metrics port or a login page answering 200 gave a JSONDecodeError traceback)."""
        response = self._request(method, path, connector=connector, **kwargs)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, shape):
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            raise ConnectError(f"{self._shown} answered {method} {path} with "
                               f"{response.status_code} but not Kafka Connect's JSON ({kind}): "
                               "is this Kafka Connect's REST URL?")
        return data

    def _not_connect(self, method: str, path: str, expected: str) -> ConnectError:
        return ConnectError(f"{self._shown} answered {method} {path} with JSON that is not "
                            f"{expected}: is this Kafka Connect's REST URL?")

    @contextmanager
    def _shaped(self, method: str, path: str) -> Iterator[None]:
        """An answer of another shape than Kafka Connect's is a ConnectError."""
        try:
            yield
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise self._not_connect(method, path, f"Kafka Connect's ({error!r})") from error


def url_problem(url: str) -> str | None:
    """Why `url` is no Kafka Connect REST URL (one line naming the value), or None. Makes no
    network call: the client a ConnectClient builds on its first request, checked up front."""
    client = ConnectClient(url)
    try:
        client._client  # noqa: B018 (builds the client, which checks the URL)
    except ConnectError as error:
        return str(error)
    finally:
        client.close()
    return None


def _path(name: str, *parts: str) -> str:
    return "/".join([f"/connectors/{quote(name, safe='')}", *parts])


def _message(response: httpx.Response) -> str:
    try:
        message = response.json().get("message")
    except (ValueError, AttributeError):
        message = None
    return on_one_line(str(message or response.reason_phrase or response.text))


def _connects_own(response: httpx.Response) -> bool:
    """True for Kafka Connect's error body: {"error_code": 404, "message": "..."}."""
    try:
        data = response.json()
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("error_code") == response.status_code


def _unknown_host(error: BaseException) -> bool:
    """Whether `error` came of a host name the resolver says does not exist (EAI_NONAME),
    not of a resolver failing for now (EAI_AGAIN) nor of a refused or reset connection."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return cause.errno == socket.EAI_NONAME
        cause = cause.__cause__ or cause.__context__
    return False
