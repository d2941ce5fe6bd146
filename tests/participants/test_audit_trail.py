"""Issue 10 item 6: the audit trail cannot be emptied (TRUNCATE raises; UPDATE/DELETE are no-ops),
on the real PostgreSQL, through the public migration path."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from cues_platform.participants.db import Database


def test_truncate_on_the_audit_trail_is_refused(make_db: Callable[[str], str]) -> None:
    dsn = make_db("bank-a")
    db = Database(dsn)
    db.migrate()
    db.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO audit (sender, message_id, action, instance_id) "
                     "VALUES ('bank-a', 'm1', 'recorded', 'i')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match="the audit trail is append-only: TRUNCATE on audit is refused"):
            conn.execute("TRUNCATE audit")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("TRUNCATE messages, audit")  # also as part of a list
        conn.execute("UPDATE audit SET action = 'tampered'")
        conn.execute("DELETE FROM audit")
        assert conn.execute("SELECT action FROM audit").fetchall() == [("recorded",)]
