"""The replication role's password and what init says of a role it leaves as is."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any, Literal

import psycopg
from psycopg import sql

from cdc_router.postgres import catalog_text, regclass_text

ROLE_LEFT = ("role {role} exists and lacks LOGIN or REPLICATION, which Debezium needs; it was "
             "left as is (init did not create it, and it may serve others): name a role of "
             "Debezium's own, or pass --alter-role")
# Also on a re-run of the init that made the role, when pg_authid is unreadable (reread 50-i
# F8: it said "init did not create the role"): say only what init knows.
PASSWORD_LEFT = ("role {role} existed before this run: its password was left as is, not set "
                 "to --replication-password (a new password would lock the role's other "
                 "clients out); if the connector cannot log in with it, pass --alter-role to "
                 "set it")
# The printed script's (`outbox init --print` without --alter-role), for a role that exists.
PRINTED_PASSWORD_LEFT = ("role {role} exists: its password and attributes were left as is, "
                         "not set to replication_password (a new password would lock the "
                         "role's other clients out); if the connector cannot log in with it, "
                         "print the script with --alter-role")


def set_password_statement(role: str, verifier: str | None = None) -> sql.Composed:
    """ALTER ROLE ... PASSWORD with a libpq-hashed verifier, or psql's :'replication_password'."""
    value: sql.Composable = (sql.Literal(verifier) if verifier is not None
                             else sql.SQL(":'replication_password'"))
    return sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(sql.Identifier(role), value)


def ensure_password(conn: psycopg.Connection[Any], role: str, password: str, *,
                     alter: bool = True) -> Literal["set", "unchanged", "left as is"]:
    readable = conn.execute("SELECT has_table_privilege('pg_authid', 'SELECT')").fetchone()
    if readable is not None and readable[0]:
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                           (role,)).fetchone()
        if row is not None and password_matches(row[0], password, role):
            return "unchanged"
    if not alter:
        return "left as is"
    algorithm_row = conn.execute("SHOW password_encryption").fetchone()
    algorithm = str(algorithm_row[0]) if algorithm_row else "scram-sha-256"
    # Hashed by libpq on this side, as psql's \password does: the plain text reaches neither
    # the server's statement log nor pg_stat_activity.
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), algorithm.encode())
    conn.execute(set_password_statement(role, verifier.decode()))
    return "set"


def password_matches(verifier: str | None, password: str, role: str) -> bool:
    # Non-ASCII passwords go through SASLprep on the server, so they may not match here; the
    # cost of that is only an unneeded (harmless) password reset.
    if not verifier:
        return False
    if verifier.startswith("SCRAM-SHA-256$"):
        try:
            counts, keys = verifier.removeprefix("SCRAM-SHA-256$").split("$")
            iterations, salt = counts.split(":")
            stored_key = keys.split(":")[0]
            salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt),
                                         int(iterations))
        except ValueError:
            return False
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        computed = base64.b64encode(hashlib.sha256(client_key).digest()).decode()
        return hmac.compare_digest(computed, stored_key)
    if verifier.startswith("md5"):
        computed = "md5" + hashlib.md5((password + role).encode()).hexdigest()
        return hmac.compare_digest(computed, verifier)
    return False


# QA 65-b F-6: a second outbox made without --replication-role, with a publication of its own:
# the connector's role (made by the first init) could not read it, and the connector and its
# task said RUNNING while the snapshot failed `permission denied` in Connect's log alone. A role
# that can log in and replicate is taken for Debezium's when it writes this init's heartbeat
# table (init's grant to its replication role) or reads another table of this publication; a
# superuser reads all. Warned, not granted: init cannot know which role the connector uses.
_DEBEZIUM_ROLES = (
    "SELECT r.rolname::text, coalesce(has_table_privilege(r.oid, to_regclass(%(heartbeat)s), "
    "'INSERT'), false), (SELECT min(format('%%I.%%I', t.schemaname, t.tablename)) FROM "
    "pg_publication_tables t WHERE t.pubname = %(publication)s AND has_table_privilege("
    "r.oid, format('%%I.%%I', t.schemaname, t.tablename), 'SELECT')) "
    "FROM pg_roles r WHERE r.rolcanlogin AND r.rolreplication AND NOT r.rolsuper "
    "AND NOT has_table_privilege(r.oid, to_regclass(%(table)s), 'SELECT') ORDER BY 1")


def unread_by_debezium_roles(conn: psycopg.Connection[Any], table: str, publication: str,
                             heartbeat_table: str, named_role: str | None) -> list[str]:
    """A warning per replication role of this publication or heartbeat table that cannot
    read `table` (schema-qualified names); none when the init names the connector's role
    (`named_role`, --replication-role, which it grants): the others are other pipelines'
    (review 66: each pipeline's own role, all writing the default heartbeat table, was told
    to read every other pipeline's outbox)."""
    if named_role is not None:
        return []
    quoted = regclass_text(table)
    rows = conn.execute(_DEBEZIUM_ROLES, {
        "table": quoted, "publication": publication,
        "heartbeat": regclass_text(heartbeat_table, "heartbeat_table")}).fetchall()
    return [unread_warning(table, quoted, catalog_text(role),
                           f"reads {catalog_text(other)} of publication {publication}"
                           if other is not None else f"writes {heartbeat_table}")
            for role, heartbeat, other in rows if heartbeat or other is not None]


def unread_warning(table: str, quoted_table: str, role: str, why: str) -> str:
    """What a connector logging in as `role` would make of `table`, and the two fixes."""
    grantee = sql.Identifier(role).as_string(None)
    return (f"role {role} (LOGIN REPLICATION; {why}, as Debezium's role does) cannot read "
            f"{table}: a connector logging in as {role} says RUNNING while its snapshot fails "
            f"`permission denied for table` (in Connect's log only) and no raw topic appears; "
            f"if it is this outbox's connector's role, run init again with --replication-role "
            f"{role}, or `GRANT SELECT ON {quoted_table} TO {grantee}`")
