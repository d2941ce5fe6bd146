"""The participant database's audit trail and consistency issues, written inside the caller's
transaction (so an audit row commits, or not, with the protocol write it describes).

Floor: below every protocol step (``postings``, ``publications``, ``replay``, ``results``,
``producer``); imports nothing of the package but the DB driver.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

log = logging.getLogger(__name__)


def audit_many(conn: psycopg.Connection, sender: str, ids: Sequence[str], action: str,
               instance: str, detail: dict[str, Any] | None = None) -> None:
    if ids:
        conn.execute(
            "INSERT INTO audit (sender, message_id, action, instance_id, detail) "
            "SELECT %s, m, %s, %s, %s FROM unnest(%s::text[]) AS m",
            (sender, action, instance, Jsonb(detail or {}), list(ids)),
        )


def record_issue(conn: psycopg.Connection, kind: str, *, instance: str, sender: str | None = None,
                 message_id: str | None = None, **detail: Any) -> None:
    """Store a consistency issue (and log it); the asset check fails while any is open."""
    conn.execute(
        "INSERT INTO consistency_issues (kind, sender, message_id, detail, instance_id) "
        "VALUES (%s, %s, %s, %s, %s)",
        (kind, sender, message_id, Jsonb(detail), instance),
    )
    log.error("consistency issue %s: sender=%s message_id=%s %s", kind, sender, message_id, detail)
