"""Step 6 of the producer contract: apply the RESULTS of subject n, exactly once, from the right
publisher only.

A result answers a posting n → p; only p may publish it. Who published a RESULTS row is known two
ways, and both must name the posting's receiver p:

* the row's ``receiver`` column (what the publisher claims), and
* the Delta commit that added the row (:class:`Publishers`): the consumer's exactly-once
  processor ``consume-{p}`` commits its results with the commit metadata ``cues.processor`` /
  ``cues.step`` and the app transaction ``proc:consume-{p} = step`` (``processing/outputs.py``),
  and with ``cues.ranges``, the offsets it added per partition. A row added by any other commit
  (a plain append, another participant's processor), a commit whose app transaction disagrees
  with its metadata, or one whose step does not increase over that processor's earlier commits,
  has no valid publisher. So a forged ``receiver`` column written by another writer is caught.

A result from the wrong publisher is a consistency issue ``wrong_publisher`` (stored, logged,
failing the asset check and ``check``) and does NOT change the posting; the real result, when it
comes, applies normally. Limits: anyone who can write the Delta table can also forge a whole
processor commit (metadata and app transaction of ``consume-{p}`` with a fresh step); only signed
results would stop that. A commit entry removed by log cleanup cannot be read: such a row is
judged by its ``receiver`` column alone (logged as a warning).

Contract of :func:`apply_results_once` (one DB transaction):

1. Lock the subscription position (``FOR UPDATE SKIP LOCKED``: one reader at a time).
2. Read the results after it (up to ``results_batch``) and find each row's publishing commit.
3. Classify each row: malformed (no id, bad status, another sender's subject), unknown message,
   wrong publisher, duplicate (in this batch, or the posting already has its result) -- each a
   consistency issue -- or good.
4. Set (acked_result, OK|REJECTED) for the good ones (audit ``result_received``).
5. Move the position past the batch. It commits with 3-4: each result applies exactly once.
"""

from __future__ import annotations

import bisect
import json
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa

from cues_platform.participants.model import RESULTS, ProcessingStatus
from cues_platform.participants.slots import ProducerSide
from cues_platform.participants.trail import audit_many, record_issue
from cues_platform.queues import Queue
from cues_platform.queues.integrity import RANGES_KEY, TableStorage, _parse_ranges, commit_path
from cues_platform.queues.layout import PROCESSOR_STEP

log = logging.getLogger(__name__)
CONSUMER_PROCESSOR = "consume-"  # the consumer's processor id is consume-{participant}
WRONG_PUBLISHER = "wrong_publisher"


@dataclass(frozen=True)
class Commit:
    """The commit that added a span of offsets of one RESULTS subject."""

    version: int
    processor: str | None  # cues.processor of the commit, if any
    publisher: str | None  # the participant whose consumer processor wrote it; None: nobody's
    why: str  # how the publisher was (not) established


def _actions(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                action = json.loads(line)
            except ValueError:
                return []
            if isinstance(action, dict):
                out.append(action)
    return out


class Publishers:
    """Which commit added each offset of RESULTS subject ``partition``, read from the Delta log
    incrementally (each commit entry once per instance; a new instance reads back from the
    newest commit to the first offset it needs)."""

    def __init__(self, queue: Queue, partition: str) -> None:
        self.queue, self.partition = queue, partition
        self.storage = TableStorage(queue.uri, queue.lake.options)
        self.starts: list[int] = []
        self.spans: list[tuple[int, int, Commit]] = []  # sorted by start
        self.scanned: int | None = None  # newest version ingested
        self.last_step: dict[str, int] = {}

    def _read(self, version: int) -> list[dict[str, Any]] | None:
        raw = self.storage.read(commit_path(version))
        return None if raw is None else _actions(raw)

    def _ingest(self, version: int, actions: list[dict[str, Any]]) -> None:
        info = next((a["commitInfo"] for a in actions if isinstance(a.get("commitInfo"), dict)), {})
        try:
            span = _parse_ranges(str(info.get(RANGES_KEY, ""))).get(self.partition)
        except ValueError:
            span = None
        processor = info.get("cues.processor")
        txns = {t.get("appId"): t.get("version") for a in actions
                if isinstance(t := a.get("txn"), dict)}
        publisher, why = None, "not written by a consumer's processor"
        if isinstance(processor, str) and processor.startswith(CONSUMER_PROCESSOR):
            step = info.get("cues.step")
            txn = txns.get(PROCESSOR_STEP.id(processor))
            last = self.last_step.get(processor)
            if step is None or txn is None or str(txn) != str(step):
                why = f"commit metadata step {step} disagrees with app transaction {txn}"
            elif last is not None and int(txn) <= last:
                why = f"step {txn} of {processor} does not increase (earlier commit: step {last})"
            else:
                self.last_step[processor] = int(txn)
                publisher, why = processor.removeprefix(CONSUMER_PROCESSOR), "processor commit"
        if span is not None and span[1] > span[0]:
            commit = Commit(version, processor if isinstance(processor, str) else None,
                            publisher, why)
            i = bisect.bisect_left(self.starts, span[0])
            if i == len(self.starts) or self.starts[i] != span[0]:
                self.starts.insert(i, span[0])
                self.spans.insert(i, (span[0], span[1], commit))

    def _covered(self, offset: int) -> bool:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i >= 0 and self.spans[i][0] <= offset < self.spans[i][1]

    def _scan(self, low: int) -> None:
        top = self.queue.refresh().version()
        if self.scanned is None:  # back from the newest commit until `low` is covered
            found: list[tuple[int, list[dict[str, Any]]]] = []
            version = top
            while version >= 0:
                actions = self._read(version)
                if actions is None:
                    break  # cleaned up before a checkpoint: older rows cannot be attributed
                found.append((version, actions))
                info = next((a["commitInfo"] for a in actions
                             if isinstance(a.get("commitInfo"), dict)), {})
                try:
                    span = _parse_ranges(str(info.get(RANGES_KEY, ""))).get(self.partition)
                except ValueError:
                    span = None
                if span is not None and span[0] <= low:
                    break
                version -= 1
            for v, actions in reversed(found):
                self._ingest(v, actions)
        else:
            for version in range(self.scanned + 1, top + 1):
                actions = self._read(version)
                if actions is not None:
                    self._ingest(version, actions)
        self.scanned = top

    def of(self, offsets: list[int]) -> dict[int, Commit | None]:
        """The commit of each offset (None: its commit entry is gone, it cannot be attributed)."""
        if offsets and (self.scanned is None or not all(map(self._covered, offsets))):
            self._scan(min(offsets))
        out: dict[int, Commit | None] = {}
        for off in offsets:
            i = bisect.bisect_right(self.starts, off) - 1
            ok = i >= 0 and self.spans[i][0] <= off < self.spans[i][1]
            out[off] = self.spans[i][2] if ok else None
        return out

    def forget_before(self, offset: int) -> None:
        """Drop the spans wholly before ``offset`` (applied already)."""
        keep = [s for s in self.spans if s[1] > offset]
        self.spans, self.starts = keep, [s[0] for s in keep]


_publishers: weakref.WeakKeyDictionary[Any, Publishers] = weakref.WeakKeyDictionary()


def publishers_of(inst: ProducerSide) -> Publishers:
    pubs = _publishers.get(inst)
    if pubs is None or pubs.queue is not inst.results:
        pubs = _publishers[inst] = Publishers(inst.results, inst.n)
    return pubs


def apply_results_once(inst: ProducerSide) -> int:
    """Apply the next RESULTS of subject n, exactly once; returns how many were read."""
    pubs = publishers_of(inst)

    def tx(conn: psycopg.Connection) -> tuple[int, int]:
        # Step 1
        row = conn.execute(
            "SELECT position FROM subscriptions WHERE queue = %s AND partition = %s "
            "FOR UPDATE SKIP LOCKED", (RESULTS, inst.n)).fetchone()
        if row is None:
            return 0, 0  # another instance is applying results right now
        position = int(row[0])
        # Step 2
        table = inst.results.read_arrow(partition=inst.n, start=position,
                                        end=position + inst.settings.results_batch)
        if table.num_rows == 0:
            return 0, position
        commits = pubs.of(table["_offset"].to_pylist())
        # Steps 3-4
        apply(inst, conn, table, commits)
        # Step 5
        end = int(table["_offset"][-1].as_py()) + 1
        conn.execute("UPDATE subscriptions SET position = %s WHERE queue = %s AND "
                     "partition = %s", (end, RESULTS, inst.n))
        return table.num_rows, end

    n, end = inst.db.run(tx, what="apply results")
    if n:
        pubs.forget_before(end)
    inst.stats["results"] += n
    return n


def _publisher_problem(r: dict[str, Any], receiver: str, commit: Commit | None) -> str | None:
    """Why the row is not a result published by ``receiver`` (None: it is)."""
    if r.get("receiver") != receiver:
        return f"its receiver column says {r.get('receiver')!r}"
    if commit is None:
        log.warning("result %s/%s at offset %s: its commit entry is gone (log cleanup), judged "
                    "by its receiver column only", r.get("sender"), r.get("message_id"),
                    r["_offset"])
        return None
    if commit.publisher != receiver:
        return (f"commit {commit.version} was written by "
                f"{commit.publisher or commit.processor or 'another writer'!r} ({commit.why})")
    return None


def apply(inst: ProducerSide, conn: psycopg.Connection, table: pa.Table,
          commits: dict[int, Commit | None] | None = None) -> None:
    """Steps 3-4 for the rows of ``table`` (``commits``: each offset's commit; None: none known,
    every row judged by its receiver column)."""
    def issue(kind: str, **kw: Any) -> None:
        inst.stats["issues"] += 1
        record_issue(conn, kind, instance=inst.instance, **kw)

    rows = table.to_pylist()
    ids = sorted({r["message_id"] for r in rows if r.get("message_id")})
    receivers = dict(conn.execute(
        "SELECT message_id, receiver FROM messages WHERE sender = %s AND message_id = ANY(%s)",
        (inst.n, ids)).fetchall()) if ids else {}
    good: dict[str, tuple[str, str | None, int]] = {}
    for r in rows:
        mid, status, offset = r.get("message_id"), r.get("status"), r["_offset"]
        if (not mid or status not in (ProcessingStatus.OK, ProcessingStatus.REJECTED)
                or r.get("sender") != inst.n):
            issue("malformed_result", sender=r.get("sender"), message_id=mid, offset=offset,
                  status=status, receiver=r.get("receiver"))
            continue
        if mid not in receivers:
            issue("unknown_message", sender=inst.n, message_id=mid, offset=offset, status=status)
            continue
        commit = (commits or {}).get(offset)
        problem = _publisher_problem(r, receivers[mid], commit)
        if problem is not None:
            issue(WRONG_PUBLISHER, sender=inst.n, message_id=mid, offset=offset, status=status,
                  receiver=receivers[mid], result_receiver=r.get("receiver"),
                  publisher=commit.publisher if commit else None,
                  processor=commit.processor if commit else None,
                  commit_version=commit.version if commit else None, why=problem)
            continue
        if mid in good:
            issue("duplicate_result", sender=inst.n, message_id=mid, offset=offset)
            continue
        good[mid] = (status, r.get("reason"), offset)
    if not good:
        return
    ids = list(good)
    updated = {r[0] for r in conn.execute(
        "UPDATE messages m SET ack_status = 'acked_result', processing_status = u.status, "
        "result_reason = u.reason, result_at = now(), updated_at = now() "
        "FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(id, status, reason) "
        "WHERE m.sender = %s AND m.message_id = u.id AND m.ack_status <> 'acked_result' "
        "RETURNING m.message_id",
        (ids, [good[i][0] for i in ids], [good[i][1] for i in ids], inst.n))}
    for mid in (i for i in ids if i not in updated):  # known (checked above): its second result
        issue("duplicate_result", sender=inst.n, message_id=mid, offset=good[mid][2],
              status=good[mid][0])
    for status in (ProcessingStatus.OK, ProcessingStatus.REJECTED):
        sel = [i for i in ids if i in updated and good[i][0] == status]
        audit_many(conn, inst.n, sel, "result_received", inst.instance, {"status": status.value})
