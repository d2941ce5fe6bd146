"""The consumer side (participant ``p``): POSTINGS subject p → validation → RESULTS subject n.

One exactly-once processor per receiving participant: ``consume-{p}``, a map from POSTINGS
partition p to RESULTS partitioned by the ``sender`` column, run by :class:`GraphRunner` on Spark
(one session per process, started only by the instance that holds the consumer lease). Its x
instances share the lease ``consumer``; the holder steps the processor, the others stand by and
take over when the lease expires (the processor's epoch fencing stops a stalled former holder).

Delivery contract of one step (the seed's consumer critical section; the processor's own
exactly-once steps -- snapshot, read, prepare, attempt, commit -- wrap it):

1. The runner takes the step's snapshot of POSTINGS p and calls :func:`consume` with the batch
   and the step's delivery hash (the same on every retry of the step).
2. In ONE transaction of p's database (``postgres_once``: the hash row commits with the writes):
   first time for this hash -- validate each posting, write one ``received`` row per
   (sender, message id) with its status OK/REJECTED, reason, hash and step, and audit it
   (``processed``); a posting whose (sender, message id) is already received (a replay, or a
   duplicate) gets NO new result (audit ``replay_suppressed``); a sender with no RESULTS subject
   is recorded with ``routed = false`` (audit ``unroutable``) and gets no result.
   A retry of the same step (same hash) writes nothing.
3. Either way, the step's output is READ BACK from ``received`` by the hash: a retry after a crash
   returns exactly the results of the first execution.
4. The runner prepares, records the attempt and commits the results to RESULTS subject n in one
   Delta commit with the delivery hash (at most once per step).

A crash before 2's commit: nothing recorded, the step is retried. After 2, before 4's commit:
the retry returns the same results (3) and delivers them once. After 4: recovery only advances.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa
from psycopg.types.json import Jsonb

from cues_platform.participants import leases
from cues_platform.participants.db import Database
from cues_platform.participants.loop import InstanceLoop
from cues_platform.participants.model import (
    EMPTY_MESSAGE_ID,
    PAYLOAD_NOT_JSON,
    PAYLOAD_TOO_LARGE,
    POSTINGS,
    POSTINGS_SCHEMA,
    RESULTS,
    RESULTS_SCHEMA,
    WRONG_RECEIVER,
    ProcessingStatus,
    Role,
    Settings,
)
from cues_platform.participants.network import require, validate_participant
from cues_platform.processing.graph import Graph, In, Kind, Options, Out, Processor, QueueDef
from cues_platform.processing.sinks import postgres_once
from cues_platform.queues import Lake

log = logging.getLogger(__name__)
CONSUMER_LEASE = "consumer"
Validator = Callable[[dict[str, Any], str, Settings], tuple[str, str | None]]


def default_validator(posting: dict[str, Any], receiver: str, settings: Settings
                      ) -> tuple[str, str | None]:
    """OK, or REJECTED with a reason: empty id, wrong subject, oversized or non-JSON payload."""
    if not posting.get("message_id"):
        return ProcessingStatus.REJECTED.value, EMPTY_MESSAGE_ID
    if posting.get("receiver") != receiver:
        return ProcessingStatus.REJECTED.value, WRONG_RECEIVER
    payload = posting.get("payload")
    if payload is not None and len(payload.encode()) > settings.max_payload_bytes:
        return ProcessingStatus.REJECTED.value, PAYLOAD_TOO_LARGE
    if payload is not None:
        try:
            json.loads(payload)
        except ValueError:
            return ProcessingStatus.REJECTED.value, PAYLOAD_NOT_JSON
    return ProcessingStatus.OK.value, None


def consume(ctx: Any, conn: psycopg.Connection, batch: pa.Table, *, receiver: str, routable: set[str],
            instance: str, settings: Settings, validator: Validator = default_validator) -> pa.Table:
    """Steps 2-3 for one batch of POSTINGS subject ``receiver``; returns the RESULTS rows."""
    rows = sorted(batch.to_pylist(), key=lambda r: r["_offset"])
    # Step 2
    with postgres_once(ctx, conn) as delivery:
        if delivery.first_time and rows:
            keys = list({(r["sender"], r["message_id"]) for r in rows})
            known = {(s, m) for s, m in conn.execute(
                "SELECT sender, message_id FROM received WHERE (sender, message_id) IN "
                "(SELECT * FROM unnest(%s::text[], %s::text[]))",
                ([k[0] for k in keys], [k[1] for k in keys]))}
            new: list[tuple] = []
            audits: list[tuple] = []
            for r in rows:
                key = (r["sender"], r["message_id"])
                detail = {"offset": r["_offset"], "replays": r["replays"], "step": ctx.step}
                if key in known:
                    audits.append((*key, "replay_suppressed", Jsonb(detail)))
                    continue
                known.add(key)
                status, reason = validator(r, receiver, settings)
                routed = r["sender"] in routable
                new.append((*key, r["receiver"], r["replays"], status, reason, routed))
                audits.append((*key, "processed" if routed else "unroutable",
                               Jsonb({**detail, "status": status, "reason": reason})))
                if not routed:
                    log.error("posting %s from unknown sender %r recorded, no result sent", key[1],
                              key[0])
            if new:
                conn.execute(
                    "INSERT INTO received (sender, message_id, receiver, replays, status, reason, "
                    "routed, delivery_hash, step) SELECT s, m, rc, rp, st, rs, ro, %s, %s FROM "
                    "unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[], "
                    "%s::bool[]) AS u(s, m, rc, rp, st, rs, ro)",
                    (ctx.delivery_hash, ctx.step, *[list(c) for c in zip(*new, strict=True)]))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO audit (sender, message_id, action, instance_id, detail) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    [(s, m, a, instance, d) for s, m, a, d in audits])
        # Step 3
        out = conn.execute(
            "SELECT sender, receiver, message_id, replays, status, reason, received_at "
            "FROM received WHERE delivery_hash = %s AND routed ORDER BY sender, message_id",
            (ctx.delivery_hash,)).fetchall()
    cols = list(zip(*out, strict=True)) if out else [[]] * 7
    return pa.table({name: list(col) for name, col in zip(RESULTS_SCHEMA.names, cols, strict=True)},
                    schema=RESULTS_SCHEMA)


class ConsumerInstance(InstanceLoop):
    """One of the x instances of consumer participant ``p``."""

    def __init__(self, *, participant: str, lake: Lake, dsn: str, instance_id: str,
                 settings: Settings | None = None, spark: Any = None,
                 validator: Validator = default_validator) -> None:
        self.p = validate_participant(participant)
        self.lake, self.instance = lake, instance_id
        self.settings = settings or Settings()
        self.db = Database(dsn, app=f"cues-participant:{self.p}:{instance_id}")
        self.spark, self.validator = spark, validator
        self.lease: leases.Lease | None = None
        self.keeper: leases.LeaseKeeper | None = None
        self.runner: Any = None
        self.stop_event = threading.Event()
        self.stats = {"steps": 0, "rows": 0, "failures": 0}

    @property
    def processor_id(self) -> str:
        return f"consume-{self.p}"

    def start(self) -> None:
        self.db.migrate()
        require(self.lake, self.p, Role.CONSUMER)
        self.db.run(lambda c: leases.ensure_leases(c, [CONSUMER_LEASE]), what="init")

    def graph(self) -> Graph:
        results = self.lake.queue(RESULTS)
        results.refresh()
        routable = set(results.partitions)

        def fn(ctx: Any, postings: Any) -> pa.Table:
            batch = postings.toArrow() if hasattr(postings, "toArrow") else postings
            conn = self.db.connection()
            return consume(ctx, conn, batch, receiver=self.p, routable=routable,
                           instance=self.instance, settings=self.settings,
                           validator=self.validator)

        proc = Processor(
            id=self.processor_id, kind=Kind.MAP, fn=fn,
            inputs={"postings": In(POSTINGS, self.p)},
            outputs={"results": Out(RESULTS, partition=None, partition_column="sender")},
            options=Options(batch_size=self.settings.consumer_batch,
                            poll_interval=self.settings.idle_poll),
            description=f"postings protocol: consumer {self.p}")
        return Graph.build(
            name=f"participant-{self.p}",
            queues=[QueueDef(POSTINGS, POSTINGS_SCHEMA, (self.p,)),
                    QueueDef(RESULTS, RESULTS_SCHEMA, tuple(sorted(routable)))],
            processors=[proc])

    def _hold_lease(self) -> bool:
        if self.keeper is None:
            self.keeper = leases.LeaseKeeper(
                self.db.dsn, app=f"{self.db.app}:lease", names=[CONSUMER_LEASE],
                owner=self.instance, ttl=self.settings.lease_seconds).start()
        lease = self.keeper.lease
        if lease is not None and lease != self.lease:
            log.info("%s took the consumer lease (epoch %s)", self.instance, lease.epoch)
            try:
                self._ensure_runner().recover()  # fences any former holder still running
            except Exception as exc:  # noqa: BLE001 - retried on the next tick
                log.warning("%s recovery failed (%s: %s)", self.instance, type(exc).__name__, exc)
                self.db.close()
                return False
        self.lease = lease
        return lease is not None

    def _ensure_runner(self) -> Any:
        if self.runner is None:
            from cues_platform.processing.runner import GraphRunner

            self.runner = GraphRunner(graph=self.graph(), lake=self.lake, spark=self.spark,
                                      keep_results=False)
        return self.runner

    def tick(self) -> bool:
        if not self._hold_lease():
            return False
        try:
            result = self._ensure_runner().step_once(self.processor_id)
        except Exception as exc:  # noqa: BLE001 - recovered on the next step (runner contract)
            self.stats["failures"] += 1
            log.warning("%s step failed (%s: %s); recovering", self.instance, type(exc).__name__, exc)
            self.db.close()
            return False
        if result is None:
            return False
        self.stats["steps"] += 1
        self.stats["rows"] += result.rows_in
        return True
