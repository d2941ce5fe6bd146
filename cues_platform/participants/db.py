"""Each participant's own PostgreSQL database: connections, retries, versioned migrations.

Default: an embedded PostgreSQL from the ``pgserver`` package (one server per data directory, one
database per participant); any external PostgreSQL by DSN (``--dsn`` / ``$CUES_POSTGRES_DSN``).

Migrations are numbered; :func:`migrate` applies the missing ones on start, each in its own
transaction together with its row in ``schema_migrations``, under a transaction-scoped advisory
lock so that x instances starting at once apply each migration exactly once.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from cues_platform.participants.errors import (
    DatabaseUnavailableError,
    MissingDatabaseError,
    ParticipantConfigError,
)
from cues_platform.participants.ids import validate_participant
from cues_platform.pgserver_db import embedded_postgres

log = logging.getLogger(__name__)
T = TypeVar("T")
_DB_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")  # fullmatch: `$` accepts a trailing newline
MIGRATION_LOCK = 0x6375_6573  # advisory lock key ("cues")

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "message record, audit trail, leases, publications, subscriptions, issues", """
CREATE TABLE messages (
    sender            text        NOT NULL,
    message_id        text        NOT NULL,
    receiver          text        NOT NULL,
    ack_status        text        NOT NULL,
    processing_status text        NOT NULL,
    replays           integer     NOT NULL DEFAULT 0,
    retries           integer     NOT NULL DEFAULT 0,
    inception_datum   timestamptz NOT NULL,
    last_datum        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    payload           text,
    pub_slot          integer,
    pub_seq           bigint,
    posting_offset    bigint,
    result_reason     text,
    result_at         timestamptz,
    created_seq       bigserial,
    PRIMARY KEY (sender, message_id),
    CHECK (ack_status IN ('nacked_posting', 'acked_posting', 'acked_result')),
    CHECK (processing_status IN ('PENDING', 'OK', 'REJECTED'))
);
CREATE INDEX messages_unassigned ON messages (created_seq)
    WHERE ack_status = 'nacked_posting' AND pub_seq IS NULL;
CREATE INDEX messages_pending ON messages (last_datum)
    WHERE ack_status = 'acked_posting' AND processing_status = 'PENDING';
CREATE INDEX messages_pub ON messages (pub_slot, pub_seq);

CREATE TABLE audit (
    id          bigserial   PRIMARY KEY,
    sender      text        NOT NULL,
    message_id  text        NOT NULL,
    action      text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    instance_id text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_message ON audit (sender, message_id);
CREATE RULE audit_no_update AS ON UPDATE TO audit DO INSTEAD NOTHING;
CREATE RULE audit_no_delete AS ON DELETE TO audit DO INSTEAD NOTHING;

CREATE TABLE leases (
    name        text        PRIMARY KEY,
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    next_seq    bigint      NOT NULL DEFAULT 0
);

CREATE TABLE publications (
    slot        integer     NOT NULL,
    seq         bigint      NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('posting', 'replay')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    acked_at    timestamptz,
    attempts    integer     NOT NULL DEFAULT 0,
    last_error  text,
    PRIMARY KEY (slot, seq)
);
CREATE INDEX publications_unacked ON publications (slot, seq) WHERE acked_at IS NULL;

CREATE TABLE publication_items (
    slot       integer NOT NULL,
    seq        bigint  NOT NULL,
    sender     text    NOT NULL,
    message_id text    NOT NULL,
    replays    integer NOT NULL,
    PRIMARY KEY (slot, seq, sender, message_id)
);

CREATE TABLE subscriptions (
    queue     text   NOT NULL,
    partition text   NOT NULL,
    position  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, partition)
);

CREATE TABLE consistency_issues (
    id          bigserial   PRIMARY KEY,
    kind        text        NOT NULL,
    sender      text,
    message_id  text,
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now(),
    instance_id text        NOT NULL
);

CREATE TABLE received (
    sender        text        NOT NULL,
    message_id    text        NOT NULL,
    receiver      text        NOT NULL,
    replays       integer     NOT NULL,
    status        text        NOT NULL,
    reason        text,
    routed        boolean     NOT NULL,
    delivery_hash text        NOT NULL,
    step          bigint      NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sender, message_id)
);
CREATE INDEX received_hash ON received (delivery_hash);
"""),
    (2, "consumer: postings waiting for their sender's registration (routed = false)", """
CREATE INDEX received_unrouted ON received (sender) WHERE NOT routed;
"""),
    (3, "audit trail: TRUNCATE raises (UPDATE/DELETE stay no-ops)", """
CREATE FUNCTION cues_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit trail is append-only: % on audit is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION cues_audit_append_only();
"""),
    (4, "takeover: members (fair share of slots), publication bail backoff and holder epoch", """
CREATE TABLE members (
    owner       text        PRIMARY KEY,
    alive_until timestamptz NOT NULL,
    joined_at   timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE publications ADD COLUMN bails integer NOT NULL DEFAULT 0;
ALTER TABLE publications ADD COLUMN retry_at timestamptz;
ALTER TABLE publications ADD COLUMN epoch bigint;
"""),
]


def validate_database_name(name: str) -> str:
    if not _DB_NAME.fullmatch(name):
        raise ParticipantConfigError(
            f"invalid database name {name!r}: lowercase letter, then letters, digits, '_'",
            database=name,
        )
    return name


LEGACY_PREFIX = "cues_p_"  # ids without '_' that fit: cues_p_<id with '-' -> '_'> (as before)
HASHED_PREFIX = "cues_h_"  # every other valid id: cues_h_<stem>_<16 hex of sha256(id)>
PG_NAME_MAX = 63  # PostgreSQL truncates identifiers to 63 bytes


def database_name(participant: str) -> str:
    """The database of a participant on a shared (embedded) server; injective on valid ids.

    1. Validate the id (``network.validate_participant``: lowercase, ``[a-z][a-z0-9_-]``, <= 64).
    2. An id without ``_`` whose name fits in 63 bytes keeps its historical database
       ``cues_p_<id with '-' replaced by '_'>``: on ids without ``_`` that replacement is
       one-to-one, so existing databases of such ids keep working.
    3. Any other id (one with ``_``, or a long one) gets ``cues_h_<first 39 characters>_<16 hex
       digits of sha256(id)>``: the prefix keeps it apart from step 2's names, the hash of the
       exact id keeps ``bank_a`` apart from another id with the same stem.
    """
    pid = validate_participant(participant)  # Step 1
    plain = pid.replace("-", "_")
    if "_" not in pid and len(LEGACY_PREFIX) + len(pid) <= PG_NAME_MAX:  # Step 2
        return validate_database_name(LEGACY_PREFIX + plain)
    digest = hashlib.sha256(pid.encode()).hexdigest()[:16]  # Step 3
    stem = plain[: PG_NAME_MAX - len(HASHED_PREFIX) - 1 - len(digest)]
    return validate_database_name(f"{HASHED_PREFIX}{stem}_{digest}")


def with_database(dsn: str, database: str) -> str:
    """``dsn`` (a URI) pointing at ``database`` instead."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def with_app_name(dsn: str, app: str) -> str:
    parts = urlsplit(dsn)
    query = parts.query + ("&" if parts.query else "") + urlencode({"application_name": app})
    return urlunsplit(parts._replace(query=query))


def ensure_database(server_dsn: str, database: str) -> str:
    """Create ``database`` on the server of ``server_dsn`` if missing; return its DSN."""
    validate_database_name(database)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            # another instance may win the race
            with suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return with_database(server_dsn, database)


def participant_dsn(participant: str, *, dsn: str | None = None, data_dir: str | Path | None = None,
                    create: bool = True) -> str:
    """The DSN of a participant's database: ``dsn`` as given (external PostgreSQL: one database
    per participant, named by the DSN), else its own database on the embedded server under
    ``data_dir``, created when missing unless ``create`` is False (read-only commands: then a
    missing server or database raises :class:`MissingDatabaseError` and nothing is created)."""
    validate_participant(participant)
    if dsn:
        return dsn
    if data_dir is None:
        raise ParticipantConfigError(
            "give a participant a DSN (--dsn / $CUES_POSTGRES_DSN) or a data directory for the "
            "embedded PostgreSQL", participant=participant
        )
    pg_dir = Path(data_dir) / "pg"
    database = database_name(participant)
    if create:
        return ensure_database(embedded_postgres(pg_dir), database)
    if not (pg_dir / "PG_VERSION").exists():  # no server: do not initdb one to find nothing
        raise _missing(participant, f"{pg_dir} (no PostgreSQL there)")
    server = embedded_postgres(pg_dir)
    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
    if not found:
        raise _missing(participant, f"{pg_dir} (database {database})")
    return with_database(server, database)


def _missing(participant: str, where: str) -> MissingDatabaseError:
    return MissingDatabaseError(
        f"participant {participant} has no database at {where}; run `cues participant migrate "
        f"--id {participant}` (with the same --data-dir/--dsn) first", participant=participant,
        where=where,
    )


def connect_existing(participant: str, *, dsn: str | None = None,
                     data_dir: str | Path | None = None) -> psycopg.Connection:
    """A connection to the participant's migrated database, for read-only commands (check,
    status, history): creates nothing; a missing database or schema is a
    :class:`MissingDatabaseError` naming the migrate command."""
    resolved = participant_dsn(participant, dsn=dsn, data_dir=data_dir, create=False)
    try:
        conn = psycopg.connect(with_app_name(resolved, "cues-participant-cli"), connect_timeout=10,
                               autocommit=True)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot connect to the database of participant {participant}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
            what="connect", participant=participant,
        ) from exc
    if conn.execute("SELECT to_regclass('schema_migrations')").fetchone()[0] is None:
        conn.close()
        raise _missing(participant, "the given --dsn (no cues schema in it)")
    return conn


def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply the missing migrations; returns the versions this call applied."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
            "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for version, description, ddl in MIGRATIONS:
            if version in done:
                continue
            with conn.transaction():
                conn.execute(ddl)  # type: ignore[arg-type]  # static DDL, no parameters
                conn.execute(
                    "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                    (version, description),
                )
            applied.append(version)
    return applied


def schema_version(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


class Database:
    """One connection of one instance, re-opened after failures; :meth:`run` retries a whole
    transaction function with exponential backoff and jitter when the connection drops (e.g. a
    ``pg_terminate_backend``). Transaction functions must be safe to retry: every protocol
    transaction re-derives what to do from the DB state, so a commit whose outcome was lost is
    harmless."""

    def __init__(self, dsn: str, *, app: str = "cues-participant", attempts: int = 12,
                 max_delay: float = 30.0) -> None:
        self.dsn, self.app = dsn, app
        self.attempts, self.max_delay = attempts, max_delay
        self._conn: psycopg.Connection | None = None

    def connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                with_app_name(self.dsn, self.app), connect_timeout=10, autocommit=True
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def run(self, fn: Callable[[psycopg.Connection], T], *, what: str = "transaction") -> T:
        """Run ``fn(conn)`` inside one transaction, retrying on connection failures."""
        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(psycopg.OperationalError),
                stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_delay),
                wait=wait_exponential_jitter(multiplier=0.02, max=1.0),
                reraise=True,
            ):
                with attempt:
                    try:
                        conn = self.connection()
                        with conn.transaction():
                            return fn(conn)
                    except psycopg.OperationalError:
                        self.close()
                        raise
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"{what}: PostgreSQL kept failing ({exc}); the outcome is unknown, retry is safe",
                what=what,
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def migrate(self) -> list[int]:
        def _m(conn: psycopg.Connection) -> list[int]:
            return migrate(conn)

        try:
            conn = self.connection()
            return migrate(conn)
        except psycopg.OperationalError:
            self.close()
            return self.run(_m, what="migrate")
