"""The platform's one clock (issue 23 item 5): every time-based rule reads it from here.

``now_ms()`` is wall-clock time in milliseconds since the Unix epoch, shifted by an offset that
tests (and the fault harness's time nemesis) move with :func:`advance` and put back with
:func:`reset`. Today it stamps the ``lastUpdated`` of the app transactions that may expire
(``queues/appender.py``) and the first epoch of a producer id (``queues/idempotence.py``).

Delta's own expiry of app transactions compares ``lastUpdated`` with the real clock of the
process that loads a snapshot (delta-rs reads the system time): moving this clock back before a
commit makes that commit's app transactions old for delta-rs, which is how tests age them.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_offset_ms = 0


def now_ms() -> int:
    """Milliseconds since the Unix epoch, as the platform sees them (real time + the offset)."""
    return time.time_ns() // 1_000_000 + _offset_ms


def advance(*, seconds: float) -> None:
    """Move the platform's clock by ``seconds`` (negative: back). Tests and the time nemesis."""
    global _offset_ms
    with _lock:
        _offset_ms += round(seconds * 1000)


def reset() -> None:
    """Put the platform's clock back on real time."""
    global _offset_ms
    with _lock:
        _offset_ms = 0
