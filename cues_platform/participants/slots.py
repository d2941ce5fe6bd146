"""A producer participant's publishing slots: their lease names, producer ids and bail backoff,
and :class:`ProducerSide`, what the start-up replay (``replay.py``) and the results step
(``results.py``) need of a producer instance.

Floor: below ``publications``, ``replay``, ``results`` and ``producer``, which import it; it
imports only the model, the database and the leases.
"""

from __future__ import annotations

from typing import Protocol

from cues_platform.participants import leases
from cues_platform.participants.db import Database
from cues_platform.participants.model import Settings
from cues_platform.queues import Queue

SLOT_PATTERN = "^slot:[0-9]+$"  # every slot row, whatever --slots says now: all are drained


def slot_names(slots: int) -> list[str]:
    return [f"slot:{i}" for i in range(slots)]


def slot_of(lease: leases.Lease) -> int:
    return int(lease.name.split(":")[1])


def producer_id(sender: str, slot: int) -> str:
    return f"{sender}.{slot}"


def bail_delay(bails: int, settings: Settings) -> float:
    """Seconds a slot waits after its publication's ``bails``-th bail (0 after the first)."""
    if bails <= 1:
        return 0.0
    return min(settings.bail_backoff_max, settings.bail_backoff_initial * 2.0 ** min(bails - 2, 60))


class ProducerSide(Protocol):
    """What replay and results use of a producer instance (``producer.ProducerInstance``)."""

    n: str  # the participant
    instance: str  # the instance id (audit rows, issues)
    settings: Settings
    db: Database
    results: Queue  # RESULTS, opened at start
    stats: dict[str, int]
    lease: leases.Lease | None  # the slot lease worked on

    @property
    def slot(self) -> int | None: ...

    def _lost(self) -> None:
        """Forget the current slot lease: a later holder fenced it."""
