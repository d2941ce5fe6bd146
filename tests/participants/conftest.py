"""Fixtures: one embedded PostgreSQL per test session, a fresh database per participant per test."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from cues_platform.participants.db import ensure_database
from cues_platform.pgserver_db import DSN_ENV, embedded_postgres

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server DSN: ``$CUES_POSTGRES_DSN`` if set, else an embedded pgserver."""
    external = os.environ.get(DSN_ENV, "").strip()
    if external:
        yield external
        return
    from cues_platform.pgserver_db import stop_embedded_postgres

    # outside pytest's basetemp: concurrent pytest sessions of the same user rotate those folders
    base = Path(tempfile.mkdtemp(prefix="cues-participants-pg-"))
    data = base / "pg"
    dsn = embedded_postgres(data)
    yield dsn
    stop_embedded_postgres(data)
    shutil.rmtree(base, ignore_errors=True)


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
