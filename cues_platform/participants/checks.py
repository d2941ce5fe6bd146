"""Consistency and completeness checks of a participant's database (used by the CLI, the tests and
the Dagster asset check in ``assets/participants.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg


@dataclass
class CheckReport:
    participant: str
    counts: dict[str, int] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.issues and not self.problems


# Actions every posting's audit trail must show, in this order, once each (replays add pairs).
REQUIRED_ONCE = ("recorded", "assigned", "posting_acked", "result_received")


def consistency_issues(conn: psycopg.Connection) -> list[dict[str, Any]]:
    cur = conn.execute("SELECT id, kind, sender, message_id, detail, at, instance_id "
                       "FROM consistency_issues ORDER BY id")
    names = [d.name for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def check_producer(conn: psycopg.Connection, participant: str, *, complete: bool = False
                   ) -> CheckReport:
    """Issues always; with ``complete`` also that every posting has its result, that replays
    match the audit trail and that every audit trail is complete."""
    report = CheckReport(participant)
    report.issues = consistency_issues(conn)
    report.counts = {f"{a}/{p}": int(c) for a, p, c in conn.execute(
        "SELECT ack_status, processing_status, count(*) FROM messages GROUP BY 1, 2")}
    if not complete:
        return report
    open_ = conn.execute("SELECT count(*) FROM messages WHERE ack_status <> 'acked_result'"
                         ).fetchone()[0]
    if open_:
        report.problems.append(f"{open_} posting(s) without a result")
    unacked = conn.execute("SELECT count(*) FROM publications WHERE acked_at IS NULL").fetchone()[0]
    if unacked:
        report.problems.append(f"{unacked} publication(s) not acked")
    bad = conn.execute(
        "SELECT m.message_id, m.replays, "
        "  count(*) FILTER (WHERE a.action = 'replay'), "
        "  count(*) FILTER (WHERE a.action = 'replay_acked'), "
        "  array_agg(a.action ORDER BY a.id) FILTER (WHERE a.action = ANY(%s)) "
        "FROM messages m LEFT JOIN audit a ON a.sender = m.sender AND a.message_id = m.message_id "
        "GROUP BY m.message_id, m.replays", (list(REQUIRED_ONCE),)).fetchall()
    for mid, replays, replayed, replay_acked, actions in bad:
        if replays != replayed or replays != replay_acked:
            report.problems.append(f"{mid}: replays={replays} but audit has {replayed} replay(s), "
                                   f"{replay_acked} replay ack(s)")
        seen = list(actions or [])
        if sorted(seen) != sorted(REQUIRED_ONCE):
            report.problems.append(f"{mid}: audit trail {seen} is not {list(REQUIRED_ONCE)}")
    return report
