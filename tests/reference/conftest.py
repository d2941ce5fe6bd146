"""Fixtures of the reference pipeline's tests: one embedded PostgreSQL per test session (pgserver
in a temporary folder, or ``$CUES_POSTGRES_DSN`` if set) and a fresh ledger schema per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cues_platform.reference.ledger import LedgerDB


@pytest.fixture(scope="session")
def ledger_dsn(pg_dsn: str) -> str:
    """The session's PostgreSQL (``pg_dsn`` in tests/conftest.py); each test uses its own schema."""
    return pg_dsn


def fresh_ledger(dsn: str) -> LedgerDB:
    """A ledger in its own, new PostgreSQL schema (dropped by the caller when done)."""
    return LedgerDB(dsn, schema=f"test_ledger_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def ledger_db(ledger_dsn: str) -> Iterator[LedgerDB]:
    db = fresh_ledger(ledger_dsn)
    yield db
    db.drop()
