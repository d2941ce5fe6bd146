"""The platform's one clock (issue 23 item 5): every time-based rule reads it from here.

``now_ms()`` is wall-clock time in milliseconds since the Unix epoch, shifted by an offset that
tests (and the fault harness's time nemesis) move with :func:`advance` and put back with
:func:`reset`. It stamps the ``_append_time`` of every appended row (retention by age,
``queues/appender.py``), the ``lastUpdated`` of the app transactions that may expire
(``queues/appender.py``), the first epoch of a producer id (``queues/idempotence.py``) and the
deadlines of transactions (``queues/transactions.py``).

Where the offset lives:

- By default, in this process (a module variable): :func:`advance` moves it for this process only.
- When the environment variable :data:`CLOCK_FILE_ENV` (``CUES_CLOCK_FILE``) names a file, the
  offset is the whole number of milliseconds written in that file, shared by every process that
  has the variable (the harness's children: runners, feeders, maintenance). :func:`advance` and
  :func:`reset` rewrite the file atomically (a temporary file in the same folder, then
  ``os.replace``), so a reader sees the old offset or the new one, never half a file. A file that
  does not exist (yet) means offset 0; a file whose content is not a whole number raises
  :class:`~cues_platform.errors.ConfigurationError` (it was not written by this module).
  ``now_ms`` is called on every append, so it costs at most one ``os.stat`` per call: the file is
  read again only when its inode, modification time or size changed (each write gives the new
  file a modification time strictly after the old one's, so two writes within the file system's
  timestamp granularity are still told apart). Several processes advancing the same file at once
  may lose one another's advances (read-add-replace is not atomic across processes): one process
  (the harness) drives it.

Delta's own expiry of app transactions compares ``lastUpdated`` with the real clock of the
process that loads a snapshot (delta-rs reads the system time): moving this clock back before a
commit makes that commit's app transactions old for delta-rs, which is how tests age them, and a
clock moved *forward* stamps them in delta-rs' future, where they never expire (docs/jepsen.md,
the time nemesis).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

from cues_platform.errors import ConfigurationError
from cues_platform.settings import current

CLOCK_FILE_ENV = "CUES_CLOCK_FILE"

_lock = threading.Lock()
_offset_ms = 0
# The shared file's last reading: (path, inode, mtime_ns, size) -> offset in ms.
_seen: tuple[str, int, int, int] | None = None
_seen_offset_ms = 0


def _file_offset(path: str) -> int:
    """The offset the file at ``path`` holds (0 when absent), re-read only when it changed."""
    global _seen, _seen_offset_ms
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return 0
    key = (path, st.st_ino, st.st_mtime_ns, st.st_size)
    if key == _seen:
        return _seen_offset_ms
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:  # replaced between the stat and the open: read the new one
        return _file_offset(path)
    try:
        offset = int(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"the platform clock file {path!r} ({CLOCK_FILE_ENV}) holds {text[:40]!r}, not a whole "
            f"number of milliseconds; remove it or unset {CLOCK_FILE_ENV} (only "
            "cues_platform.clock.advance writes it)", path=path, content=text[:40]) from None
    _seen, _seen_offset_ms = key, offset
    return offset


def clock_file() -> str | None:
    """The shared offset file this process reads (``CUES_CLOCK_FILE``), or None."""
    return current().clock_file or None


def offset_ms() -> int:
    """The current offset of the platform clock from real time, in milliseconds."""
    path = clock_file()
    return _offset_ms + (_file_offset(path) if path else 0)


def now_ms() -> int:
    """Milliseconds since the Unix epoch, as the platform sees them (real time + the offset)."""
    path = current().clock_file
    return time.time_ns() // 1_000_000 + _offset_ms + (_file_offset(path) if path else 0)


def _write_file(path: str, offset: int) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        previous = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        previous = 0
    fd, tmp = tempfile.mkstemp(prefix=".clock-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{offset}\n")
        stamp = max(time.time_ns(), previous + 1)  # strictly newer than the file it replaces
        os.utime(tmp, ns=(stamp, stamp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def advance(*, seconds: float) -> None:
    """Move the platform's clock by ``seconds`` (negative: back). Tests and the time nemesis.
    With ``CUES_CLOCK_FILE`` set, every process reading that file sees the move."""
    global _offset_ms
    step = round(seconds * 1000)
    with _lock:
        path = clock_file()
        if path:
            _write_file(path, _file_offset(path) + step)
        else:
            _offset_ms += step


def reset() -> None:
    """Put the platform's clock back on real time (the shared file too, when there is one)."""
    global _offset_ms
    with _lock:
        _offset_ms = 0
        path = clock_file()
        if path:
            _write_file(path, 0)
