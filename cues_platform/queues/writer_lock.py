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

Liveness: the lock is ``fcntl.flock`` on ``{lake}/_cues/locks/{digest of the table path}.lock``,
waited for on a helper thread (the kernel wakes it when the holder lets go); the kernel releases
it when its holder's file is closed or its process dies (SIGKILL included). A holder that is
stopped (SIGSTOP, a debugger) keeps it: a writer waits at most ``WAIT_SECONDS``, then attempts
without it (:data:`log` warns once per lock file and process), and while that given-up wait is
still pending, its process's later attempts look once (a lock the holder let go of meanwhile is
taken at once) and otherwise go without waiting (no thread piles up behind a stopped holder). A
``wait`` of 0 looks once and starts no thread. The lock files are empty and never deleted (one per queue a writer used; a
dropped queue leaves a 0-byte file).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

WAIT_SECONDS = 2.0  # the longest one attempt waits for its turn before racing without it
_warned: set[str] = set()
# per lock file, the wait given up while its helper thread still blocks (one at most: later
# attempts go without waiting until the holder lets go)
_stuck: dict[str, _Waiter] = {}
_stuck_mutex = threading.Lock()


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
    key = str(path)
    with _stuck_mutex:
        stuck = _stuck.get(key)
    # a wait given up is still pending (don't pile up threads), or none is wanted: one look only
    look_only = wait <= 0 or (stuck is not None and not stuck.finished)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if look_only:
            os.close(fd)
            turn, held = None, False
        else:
            turn = _Waiter(fd, key)  # owns fd from here: closes it when done
            held = turn.wait(wait)
    except BaseException:
        os.close(fd)
        raise
    else:
        turn, held = None, True
    try:
        if turn is not None and not held and str(path) not in _warned:
            _warned.add(str(path))
            log.warning("waited %.1f s for the writer lock %s (its holder is stopped or slow): "
                        "appending without it (commits stay safe; they may retry)", wait, path)
        yield held
    finally:
        if turn is not None:
            turn.done()
        elif held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class _Waiter:
    """A blocking ``flock`` on a helper thread, so that the caller can stop waiting: the kernel
    wakes a waiter as soon as the holder releases (no polling delay, no bias towards a newcomer
    that polls more often). The lock belongs to the open file, so the helper's acquisition is the
    caller's; an abandoned wait releases the lock as soon as the helper gets it."""

    def __init__(self, fd: int, key: str) -> None:
        self.fd, self.key = fd, key
        self.acquired = threading.Event()
        self._mutex = threading.Lock()
        self._abandoned = self._finished = False
        self.thread = threading.Thread(target=self._run, name="cues-writer-lock", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:  # the file was closed under us (cannot happen: we own fd)
            log.warning("writer lock wait failed: %s", exc)
            return
        with self._mutex:
            if not self._abandoned:
                self.acquired.set()
                return
        self._release()

    def wait(self, seconds: float) -> bool:
        if self.acquired.wait(seconds):
            return True
        with self._mutex:
            if self.acquired.is_set():  # got it just now
                return True
            self._abandoned = True  # the helper releases and closes when it gets it
        with _stuck_mutex:
            _stuck[self.key] = self
        return False

    @property
    def finished(self) -> bool:
        return self._finished

    def done(self) -> None:
        """End of the caller's block: release the lock it held (if it got it)."""
        with self._mutex:
            held = self.acquired.is_set()
        if held:
            self._release()

    def _release(self) -> None:
        with self._mutex:
            if self._finished:
                return
            self._finished = True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        with _stuck_mutex:
            if _stuck.get(self.key) is self:
                del _stuck[self.key]
