"""Writers of one queue take turns on a local lake: an advisory OS lock around each append attempt.

Why: an append builds its commit on the newest snapshot (the offsets of each partition, the
guards) and Delta's conflict check refuses it when another writer committed to the same
partitions in between; the loser writes its file again after a back-off. With nine processes
appending small batches to one queue (the postings network of ``bench/bench_participants.py``)
the losers' back-off grew until one publication waited 8.6 s for its turn while each attempt took
~50 ms. Taking turns on a lock makes every attempt of a local writer the only one in flight: no
work is thrown away and a writer waits only for the attempts queued before it.

Safety does not depend on the lock. Delta's conflict check still decides every commit: a writer
on another machine, a lake on object storage (no lock: :func:`writer_turn` yields at once) and a
writer that stopped waiting all race as before, and lose nothing but time.

Liveness: the lock is ``fcntl.flock`` on ``{lake}/_cues/locks/{digest of the table path}.lock``;
the kernel releases it when its holder's file is closed or its process dies (SIGKILL included).
A holder that is stopped (SIGSTOP, a debugger) keeps it: the others wait at most
``WAIT_SECONDS`` each time, then attempt without it (:data:`log` warns once per lock file and
process). The lock files are empty and never deleted (one per queue a writer used; a dropped
queue leaves a 0-byte file).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

WAIT_SECONDS = 2.0  # the longest one attempt waits for its turn before racing without it
_POLL_FIRST, _POLL_MAX = 0.0005, 0.005
_warned: set[str] = set()


def lock_path(locks_dir: Path, table_path: Path) -> Path:
    """The lock file of the table at ``table_path`` (its resolved path's digest: any table, any
    name, no traversal through the file name)."""
    digest = hashlib.blake2b(str(table_path.resolve()).encode(), digest_size=16).hexdigest()
    return locks_dir / f"{digest}.lock"


@contextmanager
def writer_turn(path: Path | None, *, wait: float = WAIT_SECONDS) -> Iterator[bool]:
    """Hold the lock at ``path`` for the block (yields True), or yield False at once when
    ``path`` is None (a remote lake) or after ``wait`` seconds without getting it."""
    if path is None:
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        held = _acquire(fd, wait)
        if not held and str(path) not in _warned:
            _warned.add(str(path))
            log.warning("waited %.1f s for the writer lock %s (its holder is stopped or slow): "
                        "appending without it (commits stay safe; they may retry)", wait, path)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    pause = _POLL_FIRST
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX)
