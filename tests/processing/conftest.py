"""Sink fixtures: one real PostgreSQL per test session (pgserver, or $CUES_POSTGRES_DSN if set)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from cues_platform.pgserver_db import DSN_ENV, embedded_postgres, stop_embedded_postgres


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """DSN of a real PostgreSQL: the external one in $CUES_POSTGRES_DSN, else an embedded one."""
    external = os.environ.get(DSN_ENV, "").strip()
    if external:
        yield external
        return
    data_dir = tmp_path_factory.mktemp("pgserver") / "data"
    dsn = embedded_postgres(data_dir)
    yield dsn
    stop_embedded_postgres(data_dir)


class Connector:
    """Opens connections to the session's PostgreSQL and closes them all at the end of a test."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.opened: list[psycopg.Connection] = []

    def __call__(self, *, autocommit: bool = False) -> psycopg.Connection:
        conn = psycopg.connect(self.dsn, autocommit=autocommit)
        self.opened.append(conn)
        return conn

    def close_all(self) -> None:
        for conn in self.opened:
            conn.close()
        self.opened.clear()


@pytest.fixture
def pg_connect(pg_dsn: str) -> Iterator[Connector]:
    """Factory of connections: ``pg_connect(autocommit=False)``; all closed after the test."""
    connector = Connector(pg_dsn)
    yield connector
    connector.close_all()


@pytest.fixture
def pg_names(pg_connect: Connector) -> Iterator[tuple[str, str]]:
    """Unique ``(ledger, dedupe)`` table names; the ledger exists, both are dropped afterwards."""
    suffix = uuid.uuid4().hex[:12]
    ledger, dedupe = f"ledger_{suffix}", f"deliveries_{suffix}"
    with psycopg.connect(pg_connect.dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigserial PRIMARY KEY, delivery_hash text, amount int)"
            ).format(sql.Identifier(ledger))
        )
    yield ledger, dedupe
    pg_connect.close_all()  # a test's open transaction would block the DROP
    with psycopg.connect(pg_connect.dsn, autocommit=True) as admin:
        admin.execute("SET lock_timeout = '10s'")
        for name in (ledger, dedupe):
            admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
