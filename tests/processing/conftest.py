"""Sink fixtures: connections to the session's real PostgreSQL (``pg_dsn`` in tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql


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
