"""Fixtures of the reference pipeline's tests: one embedded PostgreSQL per test session (pgserver
in a temporary folder, or ``$CUES_POSTGRES_DSN`` if set) and a fresh ledger schema per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from cues_platform.pgserver_db import DSN_ENV, embedded_postgres, stop_embedded_postgres
from cues_platform.reference.ledger import LedgerDB


@pytest.fixture(scope="session")
def ledger_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get(DSN_ENV, "").strip()
    if external:
        yield external
        return
    data_dir = tmp_path_factory.mktemp("reference-pg") / "data"
    dsn = embedded_postgres(data_dir)
    yield dsn
    stop_embedded_postgres(data_dir)


def fresh_ledger(dsn: str) -> LedgerDB:
    """A ledger in its own, new PostgreSQL schema (dropped by the caller when done)."""
    return LedgerDB(dsn, schema=f"test_ledger_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def ledger_db(ledger_dsn: str) -> Iterator[LedgerDB]:
    db = fresh_ledger(ledger_dsn)
    yield db
    db.drop()
