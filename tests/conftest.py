"""Shared fixtures: one Spark session and one PostgreSQL per test session, lakes in temporary
folders, queue factories."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from cues_platform.pgserver_db import DSN_ENV, embedded_postgres, stop_embedded_postgres
from cues_platform.queues import Lake, Queue
from tests.support import PAYLOAD, ROOT


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from cues_platform.spark import get_spark

    session = get_spark()
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(root=str(tmp_path / "lake"))


@pytest.fixture
def make_queue(lake: Lake) -> Callable[..., Queue]:
    """Factory: ``make_queue("name", partitions=[...], schema=...)`` creates a queue in ``lake``."""

    def make(
        name: str = "events",
        *,
        schema: pa.Schema = PAYLOAD,
        partitions: tuple[str, ...] = ("0",),
        **kwargs: object,
    ) -> Queue:
        return lake.create_queue(name, schema=schema, partitions=partitions, **kwargs)

    return make


@pytest.fixture
def run_python() -> Callable[..., object]:
    """Run a Python snippet in a child process with the project on sys.path."""
    import subprocess

    def run(
        code: str, *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of a real PostgreSQL: the external one in $CUES_POSTGRES_DSN, else an embedded one.

    The embedded server's data lives outside pytest's basetemp: concurrent pytest sessions of the
    same user rotate those folders (and make their parent private again) under a running server.
    """
    external = os.environ.get(DSN_ENV, "").strip()
    if external:
        yield external
        return
    base = Path(tempfile.mkdtemp(prefix="cues-test-pg-"))
    data_dir = base / "data"
    dsn = embedded_postgres(data_dir)
    yield dsn
    stop_embedded_postgres(data_dir)
    shutil.rmtree(base, ignore_errors=True)
