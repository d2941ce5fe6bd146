"""The consumer side (participant ``p``): POSTINGS subject p → validation → RESULTS subject n.

One exactly-once processor per receiving participant: ``consume-{p}``, a map from POSTINGS
partition p to RESULTS partitioned by the ``sender`` column, run by :class:`GraphRunner` with its
input read as Arrow (``ReadAs.ARROW``: fixed steps of ``consumer_batch`` postings, read by this
process from the queue's files; no Spark session, no JVM). Its x
instances share the lease ``consumer``; the holder steps the processor, the others stand by and
take over when the lease expires (the processor's epoch fencing stops a stalled former holder).

Delivery contract of one step (the seed's consumer critical section; the processor's own
exactly-once steps -- snapshot, read, prepare, attempt, commit -- wrap it):

1. The runner takes the step's snapshot of POSTINGS p and calls :func:`consume` with the batch
   and the step's delivery hash (the same on every retry of the step).
2. In ONE transaction of p's database (``postgres_once``: the hash row commits with the writes),
   first time for this hash only (a retry of the same step, same hash, writes nothing):

   a. Routes: the senders of the batch and of the ``received`` rows still waiting with
      ``routed = false`` are looked up among the RESULTS subjects (the registered producers);
      an unknown one re-reads the queue's partitions (:class:`Routes`), so a producer registered
      after this consumer started is answered without a restart.
   b. Onboarding: every waiting ``routed = false`` row whose sender is registered now is routed
      in THIS step: ``routed = true`` and the row takes this step's hash and step (audit
      ``rerouted``, with the first hash and step). It commits with the hash row, so it happens
      exactly once; its result goes out with this step's output (3).
   c. Validate each new posting, write one ``received`` row per (sender, message id) with its
      status OK/REJECTED, reason, hash and step, and audit it (``processed``); a posting whose
      (sender, message id) is already received (a replay, or a duplicate) gets NO new result
      (audit ``replay_suppressed``; ``rerouted`` when b. routed it in this step); a sender that
      is still not registered is recorded with ``routed = false`` (audit ``unroutable``) and
      waits for b.
3. Either way, the step's output is READ BACK from ``received`` by the hash: a retry after a crash
   returns exactly the results of the first execution (including the rows b. routed). Each
   result's ``receiver`` is p, the publisher (producers check it, ``results.py``).
4. The runner prepares, records the attempt and commits the results to RESULTS subject n in one
   Delta commit with the delivery hash (at most once per step).

A crash before 2's commit: nothing recorded, the step is retried. After 2, before 4's commit:
the retry returns the same results (3) and delivers them once. After 4: recovery only advances.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
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
from cues_platform.processing.graph import (
    Graph,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
    ReadAs,
    SnapshotAt,
)
from cues_platform.processing.runner import GraphRunner
from cues_platform.processing.sinks import postgres_once
from cues_platform.processing.step import Hook
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


class Routes:
    """The senders a consumer can answer: the RESULTS subjects (registered producers).

    Asked about senders it does not know, it re-reads the queue's partitions first (one Delta log
    refresh), so a producer registered while the consumer runs is routable at its first posting.
    Subjects are only ever added, so a cached sender stays routable."""

    def __init__(self, lake: Lake) -> None:
        self.queue = lake.queue(RESULTS)
        self.known = set(self.queue.partitions)

    def __call__(self, senders: Iterable[str]) -> set[str]:
        if not set(senders) <= self.known:
            self.queue.refresh()
            self.known = set(self.queue.partitions)
        return self.known


RoutesFn = Callable[[set[str]], set[str]]


def _reroute(conn: psycopg.Connection, ctx: Any, senders: list[str]) -> dict[tuple[str, str], dict]:
    """Step 2b: route the waiting ``routed = false`` rows of ``senders`` in this step."""
    if not senders:
        return {}
    old = conn.execute(
        "SELECT sender, message_id, delivery_hash, step FROM received "
        "WHERE NOT routed AND sender = ANY(%s) FOR UPDATE", (senders,)).fetchall()
    if not old:
        return {}
    conn.execute(
        "UPDATE received SET routed = true, delivery_hash = %s, step = %s "
        "WHERE NOT routed AND sender = ANY(%s)", (ctx.delivery_hash, ctx.step, senders))
    for s in senders:
        log.warning("sender %r is registered now: its waiting postings are answered in step %s",
                    s, ctx.step)
    return {(s, m): {"first_hash": h, "first_step": st, "step": ctx.step} for s, m, h, st in old}


def consume(ctx: Any, conn: psycopg.Connection, batch: pa.Table, *, receiver: str,
            routable: set[str] | RoutesFn, instance: str, settings: Settings,
            validator: Validator = default_validator) -> pa.Table:
    """Steps 2-3 for one batch of POSTINGS subject ``receiver``; returns the RESULTS rows.

    ``routable``: the registered senders, or a :class:`Routes` (refreshed on unknown senders)."""
    rows = sorted(batch.to_pylist(), key=lambda r: r["_offset"])
    routes: RoutesFn = routable if callable(routable) else (lambda _s, fixed=set(routable): fixed)
    # Step 2
    with postgres_once(ctx, conn) as delivery:
        if delivery.first_time and rows:
            # Step 2a
            waiting = {s for (s,) in conn.execute(
                "SELECT DISTINCT sender FROM received WHERE NOT routed")}
            can_route = routes({r["sender"] for r in rows} | waiting)
            # Step 2b
            rerouted = _reroute(conn, ctx, sorted(waiting & can_route))
            # Step 2c
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
                if key in rerouted:  # a replay of a waiting posting: answered in this step
                    audits.append((*key, "rerouted", Jsonb({**detail, **rerouted.pop(key)})))
                    continue
                if key in known:
                    audits.append((*key, "replay_suppressed", Jsonb(detail)))
                    continue
                known.add(key)
                status, reason = validator(r, receiver, settings)
                routed = r["sender"] in can_route
                new.append((*key, r["receiver"], r["replays"], status, reason, routed))
                audits.append((*key, "processed" if routed else "unroutable",
                               Jsonb({**detail, "status": status, "reason": reason})))
                if not routed:
                    log.error("posting %s from unregistered sender %r recorded; it is answered "
                              "once the sender is registered", key[1], key[0])
            audits += [(*key, "rerouted", Jsonb(d)) for key, d in rerouted.items()]
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
        # the receiver column names the publisher (this participant), never what a posting
        # claimed: a misrouted posting's result must not pass for its claimed receiver's
        out = conn.execute(
            "SELECT sender, %s::text, message_id, replays, status, reason, received_at "
            "FROM received WHERE delivery_hash = %s AND routed ORDER BY sender, message_id",
            (receiver, ctx.delivery_hash)).fetchall()
    cols = list(zip(*out, strict=True)) if out else [[]] * 7
    return pa.table({name: list(col) for name, col in zip(RESULTS_SCHEMA.names, cols, strict=True)},
                    schema=RESULTS_SCHEMA)


class ConsumerInstance(InstanceLoop):
    """One of the x instances of consumer participant ``p``."""

    def __init__(self, *, participant: str, lake: Lake, dsn: str, instance_id: str,
                 settings: Settings | None = None, spark: Any = None,
                 validator: Validator = default_validator, hook: Hook | None = None) -> None:
        self.p = validate_participant(participant)
        self.hook = hook  # the processor's step points (fault injection in tests)
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
        # RESULTS is routed by the row's ``sender`` column: the output commit checks each
        # partition against the queue (refreshing on a new one), so the graph's declared RESULTS
        # partitions only need to be valid names, and a later registration needs no rebuild.
        routes = Routes(self.lake)
        routable = routes(())

        def fn(ctx: Any, postings: pa.Table) -> pa.Table:
            conn = self.db.connection()
            return consume(ctx, conn, postings, receiver=self.p, routable=routes,
                           instance=self.instance, settings=self.settings,
                           validator=self.validator)

        proc = Processor(
            id=self.processor_id, kind=Kind.MAP, fn=fn,
            inputs={"postings": In(POSTINGS, self.p)},
            outputs={"results": Out(RESULTS, partition=None, partition_column="sender")},
            # The function writes the consumer's database keyed by the delivery hash
            # (postgres_once) and reads its results back by it: a retry after a crash must see
            # the same snapshot and hash, so the snapshot is recorded before the function runs.
            # Fixed-size steps read as Arrow by this process (no Spark job, no JVM): validation is
            # Python on each row, and a Spark job's fixed cost was most of a small step's time.
            options=Options(batch_size=self.settings.consumer_batch,
                            max_batch_size=self.settings.consumer_batch,
                            poll_interval=self.settings.idle_poll, snapshot_at=SnapshotAt.READ,
                            read_as=ReadAs.ARROW),
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
            self.runner = GraphRunner(graph=self.graph(), lake=self.lake, spark=self.spark,
                                      keep_results=False, hook=self.hook)
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
