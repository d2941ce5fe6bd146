"""Writers of one queue take turns on a local lake (``queues/writer_lock.py``).

Four processes appending to the SAME partition: with turns, no attempt is thrown away (every
append commits at its first attempt) and the offsets stay dense. A holder that is stopped
(SIGSTOP) delays the others by the bounded wait only, and they still commit; a holder that is
SIGKILLed releases the lock at once (the kernel closes its file).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading

import pytest

from cues_platform.queues import Lake
from cues_platform.queues import writer_lock as wl
from tests.queues.test_appender import APPENDER
from tests.support import ROOT, rows

HOLDER = """
import fcntl, os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_four_processes_on_one_partition_commit_at_their_first_attempt(make_queue, lake) -> None:
    make_queue()
    script = APPENDER.replace("q.append(", "r = q.append(") + "\n    assert r.attempts == 1, r.attempts\n"
    procs = [subprocess.Popen([sys.executable, "-c", script, lake.root, "0", "15", f"w{i}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    q = lake.queue("events")
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == list(range(4 * 15 * 2))


@pytest.fixture
def holder(make_queue):  # noqa: ANN201
    """A process holding the writer lock of queue ``events``: ``(queue, process)``."""
    q = make_queue()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(q.writer_lock)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield q, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


def test_a_stopped_holder_delays_a_writer_by_the_bounded_wait_only(holder, caplog, monkeypatch) -> None:
    q, proc = holder
    monkeypatch.setattr(wl, "_warned", set())
    monkeypatch.setattr(wl, "_stuck", {})
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with (caplog.at_level(logging.WARNING, logger=wl.__name__),
              wl.writer_turn(q.writer_lock, wait=0.3) as held):
            assert held is False  # waited, then goes on without it
        threads = threading.active_count()
        # while that given-up wait is pending, appends go without waiting and start no thread
        results = [q.append(rows(i, 2), partition="0") for i in range(0, 10, 2)]
        assert threading.active_count() == threads
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert all(r.attempts == 1 for r in results)
    assert f"waited 0.3 s for the writer lock {q.writer_lock}" in caplog.text
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == list(range(10))
    (waiter,) = wl._stuck.values()
    proc.kill()
    proc.wait(30)
    waiter.thread.join(30)  # it gets the lock once the holder is gone, and lets go at once
    assert waiter.finished and wl._stuck == {}
    with wl.writer_turn(q.writer_lock, wait=5.0) as held:
        assert held is True


def test_a_killed_holder_releases_the_lock(holder, monkeypatch) -> None:
    q, proc = holder
    monkeypatch.setattr(wl, "_stuck", {})
    threads = threading.active_count()
    with wl.writer_turn(q.writer_lock, wait=0.0) as held:
        assert held is False  # the holder has it
    # a zero wait looks once: no helper thread left blocking (it would have taken the lock after
    # the kill below and made the next turn go without it until it let go)
    assert threading.active_count() == threads and wl._stuck == {}
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    with wl.writer_turn(q.writer_lock, wait=5.0) as held:
        assert held is True


def test_the_lock_file_is_named_by_the_table_path_inside_the_lake(lake: Lake, make_queue) -> None:
    q = make_queue()
    assert q.writer_lock.parent == lake.local_path(lake.system_uri("locks"))
    assert q.writer_lock.name.endswith(".lock") and "events" not in q.writer_lock.name
    with wl.writer_turn(None) as held:  # a remote lake has no lock
        assert held is False
