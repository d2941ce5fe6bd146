"""Fixtures: a fresh database per participant per test on the session's PostgreSQL."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import psycopg
import pytest

from cues_platform.participants.db import ensure_database

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server(pg_dsn: str) -> str:
    """The session's PostgreSQL server (``pg_dsn`` in tests/conftest.py); a database per test."""
    return pg_dsn


@pytest.fixture
def make_db(pg_server: str) -> Callable[[str], str]:
    """``make_db("bank-a")`` → the DSN of a new, empty database for that participant."""

    def make(participant: str) -> str:
        name = f"t{os.getpid()}_{next(_counter)}_{participant.replace('-', '_')}"
        dsn = ensure_database(pg_server, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        return dsn

    return make
