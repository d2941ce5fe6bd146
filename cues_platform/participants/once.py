"""One bounded pass of a participant's work, in process (what a Dagster materialization runs).

:func:`run_once` drives the SAME instance code as ``cues participant run`` (``ProducerInstance`` /
``ConsumerInstance`` and their ``tick``), so it keeps the same delivery contract, and adds bounds:

1. Start like an instance: apply the missing migrations, require the registration, make sure the
   lease rows (and a producer's RESULTS subscription row) exist.
2. (Producer) apply the results already on RESULTS first: an instance replays when it takes a
   slot, normally once at start-up, but a pass takes the slot every time, and its start-up replay
   (step 3) must only replay postings whose result is really missing, not ones whose result is
   waiting to be applied. Then claim a lease like an instance does (``LeaseKeeper``: a free or
   expired slot for a producer, the ``consumer`` lease for a consumer), renewed by its heartbeat
   while the pass runs. Every protocol write of the pass checks owner/epoch in its transaction,
   so the pass is safe next to running ``cues participant run`` instances: when they hold every
   lease, the pass publishes or consumes nothing (a producer pass still applies the results, under
   the subscription row lock ``FOR UPDATE SKIP LOCKED``: one reader at a time, each result applied
   exactly once).
3. Tick until a tick makes no progress (producer: start-up replay on taking the slot, then one
   publication per tick -- oldest unacked first, so re-publishing a crashed pass's publication
   reuses its (producer id, sequence) -- and the RESULTS available; consumer: one exactly-once
   processor step per tick until POSTINGS subject p is drained; taking the lease runs the
   processor's recovery first), or until ``max_seconds``.
4. Release the lease (``lease_until = -infinity``) and close the connections, whatever happened,
   so the next pass or a running instance takes over at once. A pass killed before that leaves a
   lease that expires after ``lease_seconds``, exactly like a SIGKILLed instance.

A failed consumer step is recovered on the next tick (runner contract); after ``max_failures``
failed steps in one pass it raises :class:`PassFailedError` (retryable: the next pass recovers).
A bailed publish is not an error here: the posting stays nacked and is published again later
with the same sequence (reported as ``bailed``). Errors that an instance would retry
(``DatabaseUnavailableError``...) propagate after step 4: re-running the pass is safe.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cues_platform.participants.consumer import ConsumerInstance
from cues_platform.participants.errors import PassFailedError
from cues_platform.participants.model import POSTINGS, Role, Settings
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake


@dataclass
class PassReport:
    """What one pass did (``stats``: the instance's counters) and the participant's counts."""

    participant: str
    role: Role
    instance: str
    lease: str | None
    ticks: int = 0
    elapsed: float = 0.0
    stopped: str = "drained"
    stats: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    lag: int | None = None  # consumer: postings of its subject not processed yet


def pass_instance_id(tag: str | None = None) -> str:
    """A fresh owner name per pass (a lease claimed by one pass is never mistaken for another's)."""
    return f"pass:{tag or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def make_instance(participant: str, role: Role | str, *, lake: Lake, dsn: str, instance_id: str,
                  slots: int = 1, settings: Settings | None = None, spark: Any = None) -> Any:
    settings = settings or Settings.from_env()
    if Role(role) is Role.PRODUCER:
        return ProducerInstance(participant=participant, lake=lake, dsn=dsn,
                                instance_id=instance_id, slots=slots, settings=settings)
    return ConsumerInstance(participant=participant, lake=lake, dsn=dsn, instance_id=instance_id,
                            settings=settings, spark=spark)


def run_once(inst: Any, *, max_seconds: float = 300.0, max_failures: int = 3) -> PassReport:
    """One bounded pass of ``inst`` (a not yet started Producer/ConsumerInstance); see the module
    docstring for the contract. Returns the pass report with the participant's counts."""
    role = Role.PRODUCER if hasattr(inst, "publish_once") else Role.CONSUMER
    participant = inst.n if role is Role.PRODUCER else inst.p
    started = time.monotonic()
    report = PassReport(participant, role, inst.instance, lease=None)
    failures = 0
    try:
        inst.start()  # step 1
        if role is Role.PRODUCER:
            # results already on RESULTS first: the start-up replay (on taking the slot) must not
            # replay a posting whose result is only waiting to be applied
            while inst.apply_results_once() > 0 and time.monotonic() - started < max_seconds:
                pass
        while True:  # steps 2-3 (the first tick claims the lease)
            before = inst.stats.get("failures", 0)
            progressed = inst.tick()
            report.ticks += 1
            if inst.lease is not None:
                report.lease = f"{inst.lease.name}@{inst.lease.epoch}"
            if inst.stats.get("failures", 0) > before:
                failures += 1
                if failures >= max_failures:
                    raise PassFailedError(
                        f"participant {participant!r}: {failures} failed step(s) in one pass; "
                        "the next pass (or instance) recovers", participant=participant,
                        failures=failures)
                continue
            if not progressed:
                break
            if time.monotonic() - started > max_seconds:
                report.stopped = "max_seconds"
                break
        if report.lease is None:
            held = inst.keeper is not None and inst.keeper.lease is not None
            if role is Role.CONSUMER and held:  # took the lease, but recovery failed
                raise PassFailedError(
                    f"consumer {participant!r}: the processor's recovery failed (see the log); "
                    "the next pass retries it", participant=participant)
            report.stopped = "lease_held_elsewhere"
        report.lag = _consumer_lag(inst) if role is Role.CONSUMER else None
    finally:  # step 4
        if inst.keeper is not None:
            inst.keeper.stop()
        inst.db.close()
    report.stats = dict(inst.stats)
    report.counts = participant_counts(inst.db.dsn, role)
    report.elapsed = time.monotonic() - started
    return report


def _consumer_lag(inst: Any) -> int | None:
    runner = inst.runner
    if runner is None:
        return None
    stepper = runner.steppers[inst.processor_id]
    position = getattr(stepper, "positions", {}).get("postings", 0)
    return max(0, inst.lake.queue(POSTINGS).next_offset(inst.p) - position)


def participant_counts(dsn: str, role: Role | str) -> dict[str, int]:
    """Counts by status of a participant's database (read only; one short connection).

    Producer: ``messages`` by ack status and by processing status, replays (sum), consistency
    issues. Consumer: ``received`` by status, unroutable, replays suppressed, consistency issues.
    """
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        issues = int(conn.execute("SELECT count(*) FROM consistency_issues").fetchone()[0])
        if Role(role) is Role.PRODUCER:
            row = conn.execute(
                "SELECT count(*), "
                "count(*) FILTER (WHERE ack_status = 'nacked_posting'), "
                "count(*) FILTER (WHERE ack_status = 'acked_posting'), "
                "count(*) FILTER (WHERE ack_status = 'acked_result'), "
                "count(*) FILTER (WHERE processing_status = 'PENDING'), "
                "count(*) FILTER (WHERE processing_status = 'OK'), "
                "count(*) FILTER (WHERE processing_status = 'REJECTED'), "
                "coalesce(sum(replays), 0) FROM messages").fetchone()
            names = ("messages", "nacked_posting", "acked_posting", "acked_result", "PENDING",
                     "OK", "REJECTED", "replays")
        else:
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'OK'), "
                "count(*) FILTER (WHERE status = 'REJECTED'), count(*) FILTER (WHERE NOT routed), "
                "(SELECT count(*) FROM audit WHERE action = 'replay_suppressed') "
                "FROM received").fetchone()
            names = ("received", "OK", "REJECTED", "unroutable", "replays_suppressed")
    counts = {n: int(v) for n, v in zip(names, row, strict=True)}
    counts["consistency_issues"] = issues
    return counts
