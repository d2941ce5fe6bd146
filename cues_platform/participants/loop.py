"""The run loop shared by producer and consumer instances.

An instance ``start()``s (claims its lease through a heartbeat keeper), then ``tick()``s until
stopped: a tick does one bounded piece of protocol work and says whether it progressed. Every
piece is safe to redo, so a retryable :class:`~cues_platform.errors.CuesError` (PostgreSQL or the
lake failing transiently) only closes the connection and ticks again after a short wait; a
non-retryable one stops the instance. Idle instances back off exponentially up to
``settings.max_idle_poll`` (polling Delta logs and the database costs CPU).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cues_platform.errors import CuesError

log = logging.getLogger(__name__)


class InstanceLoop:
    """Mixin: ``run`` for a class with ``start``, ``tick``, ``stop_event``, ``settings``,
    ``keeper``, ``db``, ``stats`` and ``instance``."""

    stop_event: Any
    settings: Any
    keeper: Any
    db: Any
    stats: dict[str, int]
    instance: str

    def start(self) -> None:  # pragma: no cover - provided by the instance class
        raise NotImplementedError

    def tick(self) -> bool:  # pragma: no cover - provided by the instance class
        raise NotImplementedError

    def run(self, *, idle_exit: float | None = None) -> dict[str, int]:
        """Tick until stopped (or idle for ``idle_exit`` seconds); returns the stats."""
        self.start()
        idle_since = time.monotonic()
        delay = self.settings.idle_poll
        while not self.stop_event.is_set():
            try:
                progressed = self.tick()
            except CuesError as exc:
                if not exc.retryable:
                    raise
                log.warning("%s: %s; retrying", self.instance, exc)
                self.db.close()
                self.stop_event.wait(min(1.0, self.settings.lease_seconds / 3))
                continue
            if progressed:
                idle_since, delay = time.monotonic(), self.settings.idle_poll
            else:
                if idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                    break
                self.stop_event.wait(delay)
                delay = min(delay * 2, max(self.settings.idle_poll, self.settings.max_idle_poll))
        self.close()
        return self.stats

    def close(self) -> None:
        """Stop the lease heartbeat (releasing the lease) and close the database connection."""
        if self.keeper is not None:
            self.keeper.stop()
        self.db.close()
