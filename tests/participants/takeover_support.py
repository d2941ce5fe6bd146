"""Helpers of test_takeover.py: in-process instances that die like a SIGKILL, bounded drives, and
read-only views of a producer database."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from cues_platform.participants.model import Settings
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake


def instance(lake: Lake, dsn: str, name: str, *, slots: int, settings: Settings,
             holding: bool = True) -> ProducerInstance:
    """A started producer instance (``holding``: asserted to hold a slot at once)."""
    inst = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn, instance_id=name,
                            slots=slots, settings=settings)
    inst.start()
    assert inst._hold_lease() or not holding, f"{name} holds no slot"
    return inst


def die(inst: ProducerInstance) -> None:
    """What a SIGKILL does to an instance: its heartbeat stops, nothing is released, its
    connections go away. Its leases (and member row) expire after ``lease_seconds``."""
    keeper = inst.keeper
    assert keeper is not None
    keeper._stop.set()
    keeper._thread.join(30)
    keeper.db.close()
    inst.db.close()


def drive(insts: list[ProducerInstance], done: Callable[[], bool], *, timeout: float,
          what: str) -> None:
    """Tick ``insts`` until ``done()`` (bounded by ``timeout``); an idle round waits one poll."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        progressed = False
        for inst in insts:
            progressed |= inst.tick()
        if not progressed:
            insts[0].stop_event.wait(0.05)  # poll interval while waiting for a lease to expire


def query(dsn: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def all_acked(dsn: str) -> bool:
    """Every posting acked by POSTINGS (or already answered) and no publication left unacked."""
    row = query(dsn, "SELECT count(*) FILTER (WHERE ack_status = 'nacked_posting'), "
                     "(SELECT count(*) FROM publications WHERE acked_at IS NULL) FROM messages")[0]
    return row == (0, 0)


def slot_owners(dsn: str) -> dict[str, str | None]:
    return dict(query(dsn, "SELECT name, owner FROM leases WHERE name LIKE 'slot:%%' ORDER BY name"))
