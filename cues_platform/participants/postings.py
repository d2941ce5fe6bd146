"""Step 1 of the producer contract (``producer.py``): record postings, and count them.

:func:`post_many` records M in ONE DB transaction with status (nacked_posting, PENDING), retries
0, inception_datum = last_datum = now, and an audit row ``recorded``. A duplicate message id
(unique per sender), an oversized payload or an unknown receiver raise a typed error and write
nothing. Any process may call it (the API, the CLI, an instance): it needs no lease.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from cues_platform.participants.db import Database
from cues_platform.participants.errors import (
    DuplicateMessageError,
    InvalidPostingError,
    PayloadTooLargeError,
)
from cues_platform.participants.model import Role, Settings
from cues_platform.participants.network import require, validate_participant
from cues_platform.participants.trail import audit_many
from cues_platform.queues import Lake


@dataclass(frozen=True)
class Posting:
    receiver: str
    message_id: str
    payload: str | None


def post_many(db: Database, lake: Lake | None, *, sender: str, postings: Iterable[Posting],
              settings: Settings | None = None, instance: str = "api") -> int:
    """Step 1: record postings (nacked_posting, PENDING) in one transaction; all or nothing."""
    settings = settings or Settings()
    rows = list(postings)
    validate_participant(sender)
    seen = _validate(rows, sender=sender, settings=settings)
    if lake is not None:
        require(lake, sender, Role.PRODUCER)
        for receiver in {p.receiver for p in rows}:
            require(lake, receiver, Role.CONSUMER)

    def tx(conn: psycopg.Connection) -> int:
        cur = conn.execute(
            "INSERT INTO messages (sender, message_id, receiver, ack_status, processing_status, "
            "inception_datum, last_datum, updated_at, payload) "
            "SELECT %s, m, r, 'nacked_posting', 'PENDING', now(), now(), now(), p "
            "FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(m, r, p) "
            "ON CONFLICT (sender, message_id) DO NOTHING RETURNING message_id",
            (sender, [p.message_id for p in rows], [p.receiver for p in rows],
             [p.payload for p in rows]),
        )
        inserted = {r[0] for r in cur.fetchall()}
        if len(inserted) != len(rows):
            dups = sorted(seen - inserted)
            raise DuplicateMessageError(
                f"sender {sender!r} already recorded message id(s) {dups[:5]}"
                f"{'...' if len(dups) > 5 else ''}; ids are unique per sender; nothing was recorded",
                sender=sender, message_ids=dups)
        audit_many(conn, sender, [p.message_id for p in rows], "recorded", instance)
        return len(rows)

    return db.run(tx, what="record postings")


def _validate(rows: list[Posting], *, sender: str, settings: Settings) -> set[str]:
    """Refuse a bad id, a non-string or oversized payload, or an id twice in the call; returns
    the ids."""
    seen: set[str] = set()
    for p in rows:
        if not isinstance(p.message_id, str) or not p.message_id:
            raise InvalidPostingError(f"posting to {p.receiver!r}: the message id must be a "
                                      "non-empty string", message_id=p.message_id)
        if p.payload is not None and not isinstance(p.payload, str):
            raise InvalidPostingError(f"message {p.message_id!r}: the payload must be a string "
                                      "(serialize it first)", message_id=p.message_id)
        size = len(p.payload.encode()) if p.payload else 0
        if size > settings.max_payload_bytes:
            raise PayloadTooLargeError(
                f"message {p.message_id!r}: payload of {size} bytes exceeds max_payload_bytes="
                f"{settings.max_payload_bytes}; nothing was recorded", message_id=p.message_id,
                size=size, limit=settings.max_payload_bytes)
        if p.message_id in seen:
            raise DuplicateMessageError(f"message id {p.message_id!r} appears twice in this call "
                                        f"from {sender!r}; nothing was recorded",
                                        sender=sender, message_id=p.message_id)
        seen.add(p.message_id)
    return seen


def pending_counts(db: Database) -> dict[str, int]:
    def tx(conn: psycopg.Connection) -> dict[str, int]:
        return {f"{a}/{p}": int(c) for a, p, c in conn.execute(
            "SELECT ack_status, processing_status, count(*) FROM messages GROUP BY 1, 2")}

    return db.run(tx, what="counts")
