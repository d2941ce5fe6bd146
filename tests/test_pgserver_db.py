"""The embedded PostgreSQL starts, serves, and stops even after its parent folder is closed again."""

from __future__ import annotations

import os

import psycopg

from cues_platform.pgserver_db import embedded_postgres, stop_embedded_postgres


def test_stop_after_the_parent_folder_was_made_private_again(tmp_path_factory) -> None:
    base = tmp_path_factory.mktemp("pg-private")
    data = base / "inner" / "data"
    dsn = embedded_postgres(data)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    # what a second pytest start does to /tmp/pytest-of-<user> while the server runs
    os.chmod(base, 0o700)
    assert stop_embedded_postgres(data) is True
    assert stop_embedded_postgres(data) is False  # already stopped: says so, does not raise
