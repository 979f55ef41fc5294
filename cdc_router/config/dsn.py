"""Postgres connection strings libpq refuses before it asks any server, said one way.

A config's DSN is checked at load (`dsn_problem`), a command's --dsn before it connects; what
still reaches psycopg.connect (a library's conninfo, a PG* environment variable) is told
apart from a server's refusal by `refused_dsn`. Neither quotes the string: it holds the
password; only the refused option's name and value are shown.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

# The values libpq takes for its enumerated options (libpq's docs, "Parameter Key Words"): it
# refuses another before it contacts any server, "connection is bad: invalid sslmode value",
# and no retry cures that (review 46-2 F5: the relay retried it forever). An option reaches
# this check only when the linked libpq knows its name (conninfo_to_dict refuses the rest).
_OPTION_VALUES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby",
                             "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslcertmode": ("disable", "allow", "require"),
    "sslnegotiation": ("postgres", "direct"),
}
_INTEGER_OPTIONS = ("port", "connect_timeout", "keepalives", "keepalives_idle",
                    "keepalives_interval", "keepalives_count", "tcp_user_timeout")
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")  # libpq's parse_int_param: strtol, blanks around
_NOT_A_DSN = ("not a Postgres connection string; give postgresql://user:password@host:port/dbname "
              "or key=value pairs")
_UNKNOWN_OPTION = re.compile(r'invalid (?:connection option|URI query parameter):? "([a-z_]+)"')
_URI_PREFIXES = ("postgresql://", "postgres://")  # libpq's, matched case-sensitively
# Review 64: a database name holding an '@' (`.../my@db`) looks the same as a password
# holding '@' and '/' (`u:p@ss/x@h`), so both are refused, and the line names both.
_MISREAD_USER_INFO = ("its user or password holds an '@' or a '/' that is not percent-encoded, so "
                      "libpq would read a piece of the password as the host, port or database "
                      "(and errors would show it), or its database name an '@', which reads "
                      "the same: write '@' as %40 and '/' as %2F (libpq decodes them in the "
                      "database name too)")


def dsn_problem(dsn: str) -> str | None:
    """Why `dsn` is no Postgres connection string libpq can use, or None: its syntax, or an
    option value libpq refuses without contacting a server (sslmode, port, ...); never quotes
    the string (it holds the password), only the bad option's value."""
    if misread_user_info(dsn):
        return _MISREAD_USER_INFO
    try:
        options = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        # Not libpq's reason either: it quotes the string's words, a password among them.
        # An unknown option is named only when it is a known one misspelt ('pasword'):
        # `password=my secret_part=1` makes a piece of a password one (reread 58-r F-5).
        if (unknown := _UNKNOWN_OPTION.fullmatch(str(error).strip())) and (
                meant := difflib.get_close_matches(unknown[1], _libpq_options(), 1, 0.8)):
            return (f"its option {unknown[1]!r} is not one of libpq's connection parameters: "
                    f"did you mean {meant[0]!r}?")
        return _NOT_A_DSN
    return next(filter(None, (_value_problem(option, str(value))
                              for option, value in options.items() if value)), None)


def misread_user_info(dsn: str) -> bool:
    """True when a postgresql:// URI's user info holds an '@' or a '/' written as is: libpq
    ends the user info at the first '@' (or at a '/' before any '@'), so the rest of the
    password became the host, port or database, which its errors and ours quote (QA 64-b:
    `u:pa/ssW0rd@h` showed the whole password in "Postgres at u:pa/ssW0rd@h:5432/db")."""
    rest = next((dsn[len(prefix):] for prefix in _URI_PREFIXES if dsn.startswith(prefix)), None)
    if rest is None:
        return False
    ends = [index for index in (rest.find("@"), rest.find("/")) if index >= 0]
    if ends and rest[min(ends)] == "@":
        rest = rest[min(ends) + 1:]
    # The query may hold an '@' of its own (`?password=p@ss` is libpq's and fine).
    return "@" in rest.partition("?")[0]


@functools.cache
def _libpq_options() -> list[str]:
    """The connection parameters the linked libpq knows."""
    return [option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()]


def _value_problem(option: str, value: str) -> str | None:
    allowed = _OPTION_VALUES.get(option)
    if allowed is not None and value not in allowed:
        return f"its {option} {value!r} is not one libpq takes: {', '.join(allowed)}"
    if option not in _INTEGER_OPTIONS:
        return None
    # A port per host, or one for all; an empty one is the default.
    for item in value.split(",") if option == "port" else [value]:
        if item.strip() and not _INTEGER.fullmatch(item):
            return f"its {option} {item!r} is not an integer"
        if option == "port" and item.strip() and not 1 <= int(item) <= 65535:
            return f"its port {item!r} is not one from 1 to 65535"
    return None


# libpq's texts for an option value it refuses before it asks any server (libpq 16-18:
# fe-connect.c), the value's option named either way; a PG* variable's value reads the same.
_REFUSED_VALUE = (re.compile(r'invalid "?(?P<option>\w+)"? value: "(?P<value>[^"]*)"'),
                  re.compile(r'invalid integer value "(?P<value>[^"]*)" for connection '
                             r'option "(?P<option>\w+)"'),
                  re.compile(r'invalid (?P<option>port) number: "(?P<value>[^"]*)"'))


def refused_dsn(dsn: str, error: psycopg.Error) -> str | None:
    """Why libpq refused `dsn` without asking any server, as dsn_problem says it: the option,
    its value and what libpq takes; None when `error` is no such refusal (a server's, or no
    server reached). Reread 59 F-2: an invalid sslmode read as "Postgres refuses"."""
    if misread_user_info(dsn):  # the error names a piece of the password as a host or port
        return _MISREAD_USER_INFO
    # libpq's parse error, its text quoting the DSN's words: no SQLSTATE. A server's error is
    # a ProgrammingError too (42501 permission denied for schema, 42P01: review rv62b, it
    # read "not a Postgres connection string").
    if isinstance(error, psycopg.ProgrammingError) and error.sqlstate is None:
        return dsn_problem(dsn) or _NOT_A_DSN
    text = str(error)
    found = next((match for pattern in _REFUSED_VALUE
                  if (match := pattern.search(text)) is not None), None)
    if not text.startswith("connection is bad:") or found is None:
        return None
    if (problem := dsn_problem(dsn)) is not None:
        return problem
    # Not the DSN's value (or one dsn_problem does not check): a PG* variable's, or libpq's.
    option, value = found["option"], found["value"]
    variable = _environment_variables().get(option)
    source = (f" (from the environment variable {variable}: fix or unset it)"
              if variable and variable in os.environ and option not in _options(dsn) else "")
    return (_value_problem(option, value) or f"its {option} {value!r} is not one libpq "
            "takes") + source


@functools.cache
def _environment_variables() -> dict[str, str]:
    """The PG* environment variable of each connection parameter that has one."""
    return {option.keyword.decode(): option.envvar.decode()
            for option in psycopg.pq.Conninfo.get_defaults() if option.envvar}


def _options(dsn: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return {}
