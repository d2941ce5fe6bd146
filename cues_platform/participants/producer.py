"""The producer side (participant ``n``): record, publish to POSTINGS, apply RESULTS.

Mapping onto the idempotent producer: a participant has publishing slots (every ``slot:N`` lease
row; ``slots``, default its number of instances, creates the missing ones). An instance publishes
only under the lease of a slot (``leases.py``), with producer id ``{n}.{slot}``; it may hold
several slots (fair share among the live instances, so the slots of instances gone for good are
taken over) and serves them in turn; a *publication* is one POSTINGS commit (a batch of postings, possibly
for several receivers) under that producer id with sequence = the slot's ``next_seq`` counter,
assigned in the DB in the same transaction that assigns the postings to it. The platform producer
wants gap-free, increasing sequences per producer id: a slot always (re)publishes its oldest
unacked publication first and only assigns a new one when none is unacked, so sequences are
published in order with no gaps whichever instance holds the slot. A re-publish of the same
(producer id, sequence) after any crash is a no-op that returns the original offsets.

Delivery contract of one posting (the seed's producer protocol):

1. Record M in ONE DB transaction with status (nacked_posting, PENDING), retries 0,
   inception_datum = last_datum = now, and an audit row ``recorded`` (:func:`post_many`).
   A duplicate message id (unique per sender), an oversized payload or an unknown receiver
   raise a typed error and write nothing. (``postings.py``)
2. Assign: under the slot lease, in one DB transaction, take up to ``batch_size`` unassigned
   nacked postings (``FOR UPDATE SKIP LOCKED``), give them publication (slot, seq) and bump the
   slot's ``next_seq`` (audit ``assigned``). Only the lease holder can do this (epoch checked).
   (``publications.take_publication``)
3. CRITICAL SECTION -- publish the publication to POSTINGS, subject = receiver, through the
   idempotent producer ``{n}.{slot}`` with sequence ``seq``; wait for the ack (the Delta commit);
   retry with exponential backoff + jitter until acked, ``publish_timeout`` or
   ``publish_attempts``.
4. If it bailed: record the real number of retries, the time and the error in the DB; the
   posting stays (nacked_posting, PENDING) and step 3 is retried later with the SAME (producer
   id, sequence) and the same content -- never a second copy -- after an exponential, capped
   backoff (``retry_at``); audit ``publish_bailed`` at bails 1, 2, 4, 8, ... and
   ``publish_stuck`` once (``publications.record_bail``).
5. On ack: in one DB transaction set ack_status = acked_posting (keeping the processing status),
   the retries, the POSTINGS offset (audit ``posting_acked``; ``publications.record_ack``).
6. Subscribe to RESULTS subject n: in one DB transaction, lock the subscription position
   (``FOR UPDATE SKIP LOCKED``: one reader at a time), read the results after it, set
   (acked_result, OK|REJECTED) for each (audit ``result_received``), store a consistency issue
   for a result of an unknown message, a duplicate result or a malformed result, and move the
   position past them. The position commits with the updates: each result applies exactly once.
   (``results.py``)

Crash anywhere: before 1's commit nothing exists; after 1 or 2 the posting is picked up by the
slot's next holder (any live instance once the lease expired; audit ``republished`` on the ack); between 3's commit and 5 the re-publish is deduplicated by the producer
(step 3 returns the original offsets) and 5 runs; a result may even arrive before 5 (step 6 then
records it, and 5 does not downgrade it). Step 6 is all-or-nothing.

Floors of the producer side (each imports only those above it in this list): ``trail`` (audit
rows, consistency issues) and ``slots`` (slot names, producer ids, backoff, the
:class:`~cues_platform.participants.slots.ProducerSide` view); ``postings`` (step 1),
``publications`` (steps 2, 4, 5 in the DB), ``replay`` (start-up replay), ``results`` (step 6);
this module, the instance that runs them in turn and the critical section (step 3).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

import psycopg
import pyarrow as pa
from deltalake.exceptions import DeltaError
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from cues_platform.errors import CuesError
from cues_platform.participants import leases
from cues_platform.participants.db import Database
from cues_platform.participants.errors import LeaseLostError, PublishBailedError
from cues_platform.participants.loop import InstanceLoop
from cues_platform.participants.model import POSTINGS, RESULTS, AckStatus, Role, Settings
from cues_platform.participants.network import require, validate_participant
from cues_platform.participants.postings import Posting, pending_counts, post_many
from cues_platform.participants.publications import (
    Taken,
    postings_tables,
    record_ack,
    record_bail,
    take_publication,
)
from cues_platform.participants.replay import replay_pending
from cues_platform.participants.results import apply_results_once
from cues_platform.participants.slots import (
    SLOT_PATTERN,
    bail_delay,
    producer_id,
    slot_names,
    slot_of,
)
from cues_platform.participants.trail import audit_many, record_issue
from cues_platform.queues import Lake, Producer
from cues_platform.queues.errors import SequenceError

log = logging.getLogger(__name__)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, SequenceError):
        return False
    if isinstance(exc, CuesError):
        return exc.retryable
    return isinstance(exc, OSError | DeltaError)


class ProducerInstance(InstanceLoop):
    """One of the x instances of producer participant ``n`` (see the module docstring)."""

    def __init__(self, *, participant: str, lake: Lake, dsn: str, instance_id: str,
                 slots: int = 1, settings: Settings | None = None) -> None:
        self.n = validate_participant(participant)
        self.lake, self.instance = lake, instance_id
        self.settings = settings or Settings()
        self.db = Database(dsn, app=f"cues-participant:{self.n}:{instance_id}")
        self.slots = slots
        self.lease: leases.Lease | None = None
        self.keeper: leases.LeaseKeeper | None = None
        self._producers: dict[int, Producer] = {}
        self._replayed: set[tuple[str, int]] = set()  # (slot lease, epoch) replayed on taking it
        self._known: set[str] = set()
        self._standby_results_at = 0.0  # monotonic time of a standby's next results round
        self.stop_event = threading.Event()
        self.stats = {"published": 0, "bailed": 0, "results": 0, "issues": 0, "replayed": 0}

    # -- start-up --------------------------------------------------------------------------------
    def start(self) -> None:
        self.db.migrate()
        require(self.lake, self.n, Role.PRODUCER)
        self.postings = self.lake.queue(POSTINGS)
        self.results = self.lake.queue(RESULTS)

        def init(conn: psycopg.Connection) -> None:
            leases.ensure_leases(conn, slot_names(self.slots))
            conn.execute("INSERT INTO subscriptions (queue, partition) VALUES (%s, %s) "
                         "ON CONFLICT DO NOTHING", (RESULTS, self.n))

        self.db.run(init, what="init")

    @property
    def slot(self) -> int | None:
        return None if self.lease is None else slot_of(self.lease)

    def _hold_lease(self) -> bool:
        """Start the lease keeper (multi mode: every ``slot:N`` row, fair share) on first use and
        sync with what it holds; ``self.lease`` is the slot worked on (or the first held)."""
        if self.keeper is None:
            self.keeper = leases.LeaseKeeper(
                self.db.dsn, app=f"{self.db.app}:lease", names=slot_names(self.slots),
                owner=self.instance, ttl=self.settings.lease_seconds, pattern=SLOT_PATTERN).start()
        held = self.keeper.held()
        slots = {slot_of(lease) for lease in held}
        for slot in [s for s in self._producers if s not in slots]:
            del self._producers[slot]  # a later holder fenced it: a fresh producer if it returns
        for lease in held:
            if lease.name not in self._known:
                log.info("%s holds %s epoch %s", self.instance, lease.name, lease.epoch)
        self._known = {lease.name for lease in held}
        if self.lease not in held:
            self.lease = held[0] if held else None
        return bool(held)

    # -- the loop ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One round: sync the held slots; for each in turn, the start-up replay when it was just
        taken, then one publication; then apply results."""
        progressed = False
        holder = self._hold_lease()
        if holder:
            assert self.keeper is not None
            for lease in self.keeper.held():
                with self.keeper.using(lease.name) as current:
                    if current is None:  # released or lost meanwhile
                        continue
                    self.lease = current
                    progressed |= self._serve_slot()
        # Every instance applies results (step 6 is exactly-once whoever runs it); a standby only
        # every settings.standby_results_every seconds and without counting them as progress
        # (it backs off): the slot holders apply them at every round anyway.
        now = time.monotonic()
        if holder or now >= self._standby_results_at:
            applied = self.apply_results_once() > 0
            progressed |= applied and holder
            if not holder:
                self._standby_results_at = now + self.settings.standby_results_every
        return progressed

    def _serve_slot(self) -> bool:
        """Replay what is pending when the slot was just taken, then publish once under it."""
        assert self.lease is not None
        key = (self.lease.name, self.lease.epoch)
        if key not in self._replayed:
            self.stats["replayed"] += replay_pending(self)
            self._replayed.add(key)
            if self.lease is None:
                return False  # lost while replaying
        try:
            return self.publish_once()
        except LeaseLostError:
            self._lost()
        except PublishBailedError as exc:
            log.warning("%s", exc)
        return False

    # -- Steps 2-5 ---------------------------------------------------------------------------------
    def _take_publication(self, conn: psycopg.Connection) -> Taken | None:
        """Step 2 under the current slot lease (``publications.take_publication``)."""
        assert self.lease is not None
        return take_publication(conn, self.lease, sender=self.n, instance=self.instance,
                                batch_size=self.settings.batch_size)

    def _batches(self, items: list[tuple]) -> dict[str, pa.Table]:
        return postings_tables(self.n, items)

    def publish_once(self) -> bool:
        taken = self.db.run(self._take_publication, what="take publication")
        if taken is None:
            return False
        seq, items = taken.seq, taken.items
        slot = self.slot
        assert slot is not None and self.lease is not None
        pid = producer_id(self.n, slot)
        if slot not in self._producers:
            self._producers[slot] = Producer(self.postings, producer_id=pid)
        producer = self._producers[slot]
        batches = self._batches(items)
        started = datetime.now(UTC)
        attempts = 0
        # Step 3: CRITICAL SECTION
        try:
            for attempt in Retrying(
                retry=retry_if_exception(_retryable),
                stop=stop_after_attempt(self.settings.publish_attempts)
                | stop_after_delay(self.settings.publish_timeout),
                wait=wait_exponential_jitter(multiplier=self.settings.backoff_initial,
                                             max=self.settings.backoff_max),
                reraise=True,
            ):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    result = producer.send_many(batches, sequence=seq)
        except Exception as exc:
            # Step 4: a failed send leaves the producer pinned to this batch (or fenced by another
            # instance that took the slot): the next publication opens a fresh producer (new epoch).
            self._producers.pop(slot, None)
            bails, wait = self._record_bail(seq, items, attempts, started, exc)
            self.stats["bailed"] += 1
            raise PublishBailedError(
                f"{pid} sequence {seq}: not acknowledged after {attempts} attempt(s) "
                f"({type(exc).__name__}: {exc}); kept nacked, bail #{bails}, will publish the "
                f"same sequence again in {wait:g} s", producer_id=pid, sequence=seq,
                attempts=attempts, bails=bails, retry_in=wait) from exc
        # Step 5
        offsets: dict[str, int] = {}
        for receiver, table in batches.items():
            start = result.ranges[receiver][0]
            for i, mid in enumerate(table["message_id"].to_pylist()):
                offsets[mid] = start + i
        lease = self.lease

        def ack(conn: psycopg.Connection) -> None:
            record_ack(conn, lease, sender=self.n, instance=self.instance, taken=taken,
                       attempts=attempts, offsets=offsets, duplicate=result.duplicate)

        self.db.run(ack, what="record ack")
        self.stats["published"] += len(items)
        return True

    def _record_bail(self, seq: int, items: list[tuple], attempts: int, started: datetime,
                     exc: BaseException) -> tuple[int, float]:
        """Step 4 (``publications.record_bail``); returns (bails so far, seconds to wait)."""
        lease = self.lease
        assert lease is not None
        ids = [r[1] for r in items]

        def bail(conn: psycopg.Connection) -> tuple[int, float]:
            return record_bail(conn, lease, sender=self.n, instance=self.instance, seq=seq,
                               ids=ids, attempts=attempts, started=started, exc=exc,
                               settings=self.settings)

        try:
            return self.db.run(bail, what="record bail")
        except LeaseLostError:
            self._lost()
            return 0, 0.0

    def _lost(self) -> None:
        lease, self.lease = self.lease, None
        if self.keeper is not None and lease is not None:
            self.keeper.lost(lease)

    # -- Step 6 ------------------------------------------------------------------------------------
    def apply_results_once(self) -> int:
        """Apply the next RESULTS of subject n, exactly once; returns how many were read."""
        return apply_results_once(self)


__all__ = ["AckStatus", "Posting", "ProducerInstance", "Taken", "audit_many", "bail_delay",
           "pending_counts", "post_many", "producer_id", "record_issue", "slot_names"]
