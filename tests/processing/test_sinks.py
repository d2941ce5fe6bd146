"""Idempotent sinks against real stores: Delta tables in tmp_path and a real PostgreSQL."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from psycopg import sql

from cues_platform.errors import CuesError
from cues_platform.pgserver_db import DSN_ENV, dsn_from_env, embedded_postgres
from cues_platform.processing.sinks import (
    DeliveryHashReusedError,
    InvalidSinkInputError,
    SinkError,
    SinkSchemaError,
    SinkStorageError,
    applied,
    postgres_once,
    write_delta_once,
)


@dataclass(frozen=True)
class Ctx:
    processor_id: str
    step: int
    delivery_hash: str


def ctx(step: int, processor: str = "proc-a") -> Ctx:
    digest = hashlib.blake2b(f"{processor}:{step}".encode(), digest_size=16).hexdigest()
    return Ctx(processor, step, digest)


def batch(start: int, n: int = 3) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64())})


def ids(uri: Path) -> list[int]:
    return sorted(DeltaTable(str(uri)).to_pyarrow_table().column("id").to_pylist())


# -- Delta -----------------------------------------------------------------------------------------
def test_delta_same_step_twice_writes_once(tmp_path: Path) -> None:
    uri, c = tmp_path / "out", ctx(0)
    assert write_delta_once(c, table_uri=str(uri), data=batch(0)) is True
    assert write_delta_once(c, table_uri=str(uri), data=batch(0)) is False
    assert ids(uri) == [0, 1, 2]
    dt = DeltaTable(str(uri))
    assert dt.transaction_version("sink:proc-a") == 0
    assert dt.history(1)[0]["cues.hash"] == c.delivery_hash


def test_delta_later_step_writes_and_older_step_is_noop(tmp_path: Path) -> None:
    uri = str(tmp_path / "out")
    assert write_delta_once(ctx(0), table_uri=uri, data=batch(0))
    assert write_delta_once(ctx(1), table_uri=uri, data=batch(10))
    assert not write_delta_once(ctx(0), table_uri=uri, data=batch(0))
    # another processor has its own steps on the same table
    assert write_delta_once(ctx(0, "proc-b"), table_uri=uri, data=batch(20))
    assert ids(Path(uri)) == [0, 1, 2, 10, 11, 12, 20, 21, 22]


@pytest.mark.parametrize("exists", [False, True])
def test_delta_concurrent_retries_apply_once(tmp_path: Path, exists: bool) -> None:
    uri, c, workers = str(tmp_path / "out"), ctx(7), 4
    if exists:
        assert write_delta_once(ctx(6), table_uri=uri, data=batch(100))
    barrier = threading.Barrier(workers)

    def retry(_: int) -> bool:
        barrier.wait()
        return write_delta_once(c, table_uri=uri, data=batch(0))

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(retry, range(workers)))
    assert results.count(True) == 1
    assert ids(Path(uri)) == [0, 1, 2] + ([100, 101, 102] if exists else [])


CHILD = """
import hashlib, os, signal, sys
import pyarrow as pa
from cues_platform.processing.sinks import write_delta_once

class Ctx:
    processor_id, step = "proc-a", 0
    delivery_hash = hashlib.blake2b(b"proc-a:0", digest_size=16).hexdigest()

data = pa.table({"id": pa.array([0, 1, 2], pa.int64())})
wrote = write_delta_once(Ctx(), table_uri=sys.argv[1], data=data, hash_column="_hash")
print("wrote", wrote, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_delta_sigkill_after_commit_then_retry(
    tmp_path: Path, run_python: Callable[..., object]
) -> None:
    uri = str(tmp_path / "out")
    proc = run_python(CHILD, uri, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "wrote True" in proc.stdout
    assert write_delta_once(ctx(0), table_uri=uri, data=batch(0), hash_column="_hash") is False
    assert ids(Path(uri)) == [0, 1, 2]
    hashes = DeltaTable(uri).to_pyarrow_table().column("_hash").to_pylist()
    assert hashes == [ctx(0).delivery_hash] * 3  # the child added the hash column on request


def test_delta_bad_input(tmp_path: Path) -> None:
    uri = str(tmp_path / "out")
    with pytest.raises(InvalidSinkInputError, match="delivery_hash") as info:
        write_delta_once(Ctx("p", 0, "NOT-A-HASH"), table_uri=uri, data=batch(0))
    assert info.value.processor == "p" and not info.value.retryable
    with pytest.raises(InvalidSinkInputError, match="step"):
        write_delta_once(Ctx("p", -1, "0" * 32), table_uri=uri, data=batch(0))
    with pytest.raises(InvalidSinkInputError, match="mode"):
        write_delta_once(ctx(0), table_uri=uri, data=batch(0), mode="merge")  # type: ignore[arg-type]
    with pytest.raises(InvalidSinkInputError, match="hash_column"):
        write_delta_once(ctx(0), table_uri=uri, data=batch(0), hash_column="id")
    assert not (tmp_path / "out").exists()
    assert write_delta_once(ctx(0), table_uri=uri, data=batch(0))
    with pytest.raises(SinkSchemaError) as schema:
        write_delta_once(ctx(1), table_uri=uri, data=pa.table({"other": ["x"]}))
    assert schema.value.step == 1 and isinstance(schema.value, CuesError)
    assert ids(Path(uri)) == [0, 1, 2]


# -- PostgreSQL ------------------------------------------------------------------------------------
def book(conn: psycopg.Connection, ledger: str, c: Ctx, amount: int = 1) -> None:
    """The user's side effect: one ledger row, written on the delivery's connection."""
    query = sql.SQL("INSERT INTO {} (delivery_hash, amount) VALUES (%s, %s)")
    conn.execute(query.format(sql.Identifier(ledger)), (c.delivery_hash, amount))


def deliver(conn: psycopg.Connection, c: Ctx, names: tuple[str, str], amount: int = 1) -> bool:
    ledger, dedupe = names
    with postgres_once(c, conn, table=dedupe) as tx:
        if tx.first_time:
            book(conn, ledger, c, amount)
    return tx.first_time


def ledger_rows(conn: psycopg.Connection, ledger: str) -> list[tuple[str, int]]:
    query = sql.SQL("SELECT delivery_hash, amount FROM {} ORDER BY id").format(
        sql.Identifier(ledger)
    )
    return [(h, a) for h, a in conn.execute(query).fetchall()]


def wait_blocked(observer: psycopg.Connection, pid: int, blocker: int) -> None:
    """Poll until backend ``pid`` waits on a lock held by ``blocker`` (observed, not timed)."""
    deadline, query = time.monotonic() + 20, "SELECT %s = ANY(pg_blocking_pids(%s))"
    while not observer.execute(query, (blocker, pid)).fetchone()[0]:
        assert time.monotonic() < deadline, f"backend {pid} never waited on {blocker}"


def test_pg_same_hash_twice_applies_once(pg_connect, pg_names) -> None:
    conn, c = pg_connect(), ctx(0)
    assert not applied(conn, c.delivery_hash, table=pg_names[1])
    assert deliver(conn, c, pg_names, amount=5) is True
    assert deliver(conn, c, pg_names, amount=5) is False
    assert deliver(conn, ctx(1), pg_names, amount=7) is True
    check = pg_connect(autocommit=True)
    assert deliver(check, c, pg_names, amount=5) is False  # autocommit connections work the same
    assert ledger_rows(check, pg_names[0]) == [(c.delivery_hash, 5), (ctx(1).delivery_hash, 7)]
    assert applied(check, c.delivery_hash, table=pg_names[1])
    query = sql.SQL("SELECT processor_id, step, applied_at FROM {} WHERE delivery_hash = %s")
    row = check.execute(query.format(sql.Identifier(pg_names[1])), (c.delivery_hash,)).fetchone()
    assert row[:2] == ("proc-a", 0) and row[2] is not None


def test_pg_failure_inside_rolls_back_both(pg_connect, pg_names) -> None:
    conn, c = pg_connect(), ctx(0)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), postgres_once(c, conn, table=pg_names[1]) as tx:
        assert tx.first_time
        book(conn, pg_names[0], c)
        raise Boom
    check = pg_connect(autocommit=True)
    assert ledger_rows(check, pg_names[0]) == []
    assert not applied(check, c.delivery_hash, table=pg_names[1])
    assert deliver(conn, c, pg_names) is True
    assert ledger_rows(check, pg_names[0]) == [(c.delivery_hash, 1)]


def test_pg_connection_killed_mid_transaction(pg_connect, pg_names) -> None:
    victim, killer, c = pg_connect(), pg_connect(autocommit=True), ctx(3)
    deliver(victim, ctx(2), pg_names)  # the dedupe table exists; this delivery is committed
    pid = victim.info.backend_pid
    with pytest.raises(SinkStorageError) as info, postgres_once(c, victim, table=pg_names[1]):
        book(victim, pg_names[0], c)
        # waits (up to 10 s) until the backend is gone, so the COMMIT surely fails
        assert killer.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()[0]
    assert info.value.retryable and info.value.hash == c.delivery_hash
    assert victim.closed
    assert not applied(killer, c.delivery_hash, table=pg_names[1])
    assert ledger_rows(killer, pg_names[0]) == [(ctx(2).delivery_hash, 1)]
    retry = pg_connect()
    assert deliver(retry, c, pg_names) is True
    assert deliver(retry, c, pg_names) is False
    assert [h for h, _ in ledger_rows(killer, pg_names[0])] == [
        ctx(2).delivery_hash,
        c.delivery_hash,
    ]


@pytest.mark.parametrize("first_commits", [True, False])
def test_pg_concurrent_retries_two_connections(pg_connect, pg_names, first_commits) -> None:
    a, b, observer, c = pg_connect(), pg_connect(), pg_connect(autocommit=True), ctx(9)
    a_pid, b_pid = a.info.backend_pid, b.info.backend_pid
    deliver(a, ctx(8), pg_names)  # create the dedupe table up front

    class Crash(Exception):
        pass

    with ThreadPoolExecutor(1) as pool:
        expect = nullcontext() if first_commits else pytest.raises(Crash)
        with expect, postgres_once(c, a, table=pg_names[1]) as tx:
            assert tx.first_time
            book(a, pg_names[0], c)
            second = pool.submit(deliver, b, c, pg_names)
            wait_blocked(observer, b_pid, a_pid)
            if not first_commits:
                raise Crash
        # the second retry waited for the first: it applies only if the first rolled back
        assert second.result(timeout=30) is (not first_commits)
    hashes = [h for h, _ in ledger_rows(observer, pg_names[0])]
    assert hashes == [ctx(8).delivery_hash, c.delivery_hash]


def test_pg_concurrent_free_for_all(pg_connect, pg_names) -> None:
    workers, c = 4, ctx(0)
    conns = [pg_connect() for _ in range(workers)]
    barrier = threading.Barrier(workers)

    def retry(conn: psycopg.Connection) -> bool:
        barrier.wait()
        return deliver(conn, c, pg_names)  # the dedupe table does not exist yet: racing creators

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(retry, conns))
    assert results.count(True) == 1
    assert ledger_rows(pg_connect(autocommit=True), pg_names[0]) == [(c.delivery_hash, 1)]


def test_pg_bad_input(pg_connect, pg_names) -> None:
    conn = pg_connect()
    for bad in ["x; DROP TABLE y", "", "1abc", "a" * 64, 'quo"te']:
        match = "invalid sink table name"
        with (
            pytest.raises(InvalidSinkInputError, match=match) as info,
            postgres_once(ctx(0), conn, table=bad),
        ):
            pass
        assert info.value.table == bad and not info.value.retryable
        with pytest.raises(InvalidSinkInputError):
            applied(conn, ctx(0).delivery_hash, table=bad)
    with (
        pytest.raises(SinkError, match="delivery_hash"),
        postgres_once(Ctx("p", 0, "A" * 32), conn),
    ):
        pass
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not applied(conn, ctx(0).delivery_hash, table=pg_names[1])  # table missing -> False
    assert deliver(conn, ctx(0), pg_names)
    with pytest.raises(DeliveryHashReusedError, match="step 0"):
        deliver(conn, Ctx("proc-a", 1, ctx(0).delivery_hash), pg_names)
    assert len(ledger_rows(conn, pg_names[0])) == 1


def test_dsn_from_env_prefers_environment(monkeypatch, tmp_path: Path, pg_dsn: str) -> None:
    monkeypatch.setenv(DSN_ENV, "postgresql://u:secret@db.example/x")
    assert dsn_from_env(tmp_path / "never") == "postgresql://u:secret@db.example/x"
    assert not (tmp_path / "never").exists()
    monkeypatch.delenv(DSN_ENV)
    if pg_dsn.startswith(
        "postgresql://postgres:@/"
    ):  # embedded: the same dir gives the same server
        with psycopg.connect(pg_dsn) as conn:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]
        assert embedded_postgres(data_dir) == pg_dsn
