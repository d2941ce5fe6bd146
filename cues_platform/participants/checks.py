"""Consistency and completeness checks of a participant's database (used by the CLI, the tests and
the Dagster asset check in ``assets/participants.py``).

:func:`check_producer` for a sender, :func:`check_consumer` for a receiver,
:func:`check_participant` for either (or both: one database serves both roles of a participant).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from cues_platform.participants.model import POSTINGS, RESULTS, Role
from cues_platform.participants.results import Publishers

if TYPE_CHECKING:
    from cues_platform.queues import Lake


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
# A consumer audits every posting it reads from its POSTINGS subject with one of these (detail:
# the posting's offset); ``rerouted`` without an offset is a waiting posting answered later.
CONSUMER_ACTIONS = ("processed", "unroutable", "replay_suppressed", "rerouted")


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


def check_consumer(conn: psycopg.Connection, participant: str, *, lake: Lake | None = None,
                   complete: bool = False) -> CheckReport:
    """A receiver's checks. Issues always; with ``complete`` also: no received posting waits for
    its sender's registration (``routed = false``); and, given the ``lake``, every routed posting
    has exactly one result on RESULTS published by this participant, and every posting on its
    POSTINGS subject has been processed (received, suppressed or waiting)."""
    report = CheckReport(participant)
    report.issues = consistency_issues(conn)
    counts = {f"received/{st}": int(c) for st, c in conn.execute(
        "SELECT status, count(*) FROM received GROUP BY 1")}
    waiting = {s: int(c) for s, c in conn.execute(
        "SELECT sender, count(*) FROM received WHERE NOT routed GROUP BY 1")}
    counts["unrouted"] = sum(waiting.values())
    report.counts = counts
    if not complete:
        return report
    registered: set[str] | None = None
    if lake is not None and lake.has_queue(RESULTS):
        results = lake.queue(RESULTS)
        results.refresh()
        registered = set(results.partitions)
    for sender, n in sorted(waiting.items()):
        state = ("registered now: answered at the consumer's next step" if registered is not None
                 and sender in registered else "not registered: register it (cues participant "
                 f"register --id {sender} --role producer)")
        report.problems.append(f"{n} posting(s) from sender {sender!r} without a result, sender "
                               f"{state}")
    if lake is None:
        return report
    routed: dict[str, set[str]] = {}
    for sender, mid in conn.execute("SELECT sender, message_id FROM received WHERE routed"):
        routed.setdefault(sender, set()).add(mid)
    for sender, mids in sorted(routed.items()):
        published: dict[str, int] = {}
        if registered is not None and sender in registered:
            queue = lake.queue(RESULTS)
            table = queue.read_arrow(partition=sender, columns=["_offset", "receiver",
                                                                "message_id"])
            offsets = table["_offset"].to_pylist()
            # A result is this participant's when its commit was written by this participant's
            # processor (a forged receiver column from another writer is not); a row whose
            # commit entry is gone is judged by its receiver column, as the sender does.
            commits = Publishers(queue, sender).of(offsets)
            for off, rc, mid in zip(offsets, table["receiver"].to_pylist(),
                                    table["message_id"].to_pylist(), strict=True):
                commit = commits.get(off)
                mine = rc == participant and (commit is None or commit.publisher == participant)
                if mine:
                    published[mid] = published.get(mid, 0) + 1
        missing = sorted(mids - set(published))
        doubled = sorted(m for m, c in published.items() if c > 1)
        if missing:
            report.problems.append(f"{len(missing)} posting(s) from {sender!r} without a published "
                                   f"result: {missing[:5]}{'...' if len(missing) > 5 else ''}")
        if doubled:
            report.problems.append(f"{len(doubled)} posting(s) from {sender!r} with more than one "
                                   f"result: {doubled[:5]}{'...' if len(doubled) > 5 else ''}")
    behind = postings_not_processed(conn, lake, participant)
    if behind is not None:
        report.counts["postings_not_processed"] = behind
        if behind:
            report.problems.append(f"{behind} posting(s) on {POSTINGS}/{participant} not "
                                   "processed yet (is a consumer instance running?)")
    return report


def postings_not_processed(conn: psycopg.Connection, lake: Lake, participant: str) -> int | None:
    """Copies on the consumer's POSTINGS subject (replays included) that its audit trail has no
    verdict for yet; None when the lake has no such subject."""
    if not lake.has_queue(POSTINGS):
        return None
    postings = lake.queue(POSTINGS)
    postings.refresh()
    if participant not in postings.partitions:
        return None
    seen = conn.execute("SELECT count(DISTINCT (detail->>'offset')::bigint) FROM audit "
                        "WHERE action = ANY(%s) AND detail ? 'offset'", (list(CONSUMER_ACTIONS),)).fetchone()[0]
    return postings.next_offset(participant) - int(seen)


def check_participant(conn: psycopg.Connection, participant: str, *,
                      role: Role | str | None = None, lake: Lake | None = None,
                      complete: bool = False) -> CheckReport:
    """:func:`check_producer` or :func:`check_consumer` by ``role``; with no role, each role the
    database has data for (a producer's ``messages``, a consumer's ``received``), merged."""
    if role is not None:
        if Role(role) is Role.PRODUCER:
            return check_producer(conn, participant, complete=complete)
        return check_consumer(conn, participant, lake=lake, complete=complete)
    sends, receives = conn.execute("SELECT EXISTS (SELECT 1 FROM messages), "
                                   "EXISTS (SELECT 1 FROM received)").fetchone()
    if receives and not sends:
        return check_consumer(conn, participant, lake=lake, complete=complete)
    report = check_producer(conn, participant, complete=complete)
    if receives:
        other = check_consumer(conn, participant, lake=lake, complete=complete)
        report.counts.update(other.counts)
        report.problems += other.problems
    return report
