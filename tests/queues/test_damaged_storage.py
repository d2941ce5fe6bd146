"""A full disk, a read-only lake and a lost acknowledgement are one typed line naming the cause,
and the advice after a failed commit can never write anything twice (per commit path)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from cues_platform.queues import Lake
from cues_platform.queues.errors import (
    CommitOutcomeUnknownError,
    StorageFullError,
    StorageNotWritableError,
    StorageUnreachableError,
)
from cues_platform.queues.faults import CONSEQUENCE, storage_fault
from tests.support import PAYLOAD, rows

# what object_store raises (colours and all) when a commit's answer is lost
LOST_ACK = "Generic S3 error: Error after 10 retries in 2.1s, max_retries:10, retry_timeout:180s"


@pytest.mark.parametrize("during", sorted(CONSEQUENCE))
def test_every_lost_ack_message_gives_advice_that_cannot_duplicate(during) -> None:
    error = storage_fault(OSError(LOST_ACK), table="queue 'orders'", uri="s3://b/lake/queues/orders",
                          during=during)
    assert isinstance(error, CommitOutcomeUnknownError) and error.during == during
    message = str(error)
    assert "\n" not in message and LOST_ACK.split(":")[0] in message
    advice = {
        # a plain append has no sequence: never told to resend, told how to find out
        "commit": ["do not resend the same batch blindly", "Queue.next_offset", "Producer"],
        "send": ["resend the same batch with the same producer", "no-op"],
        "decide": ["call commit() (or abort()) again on the same producer", "never decides twice"],
        "roll-forward": ["call commit() again", "written once"],
        "position": ["commit the same position again", "changes nothing"],
    }[during]
    assert all(a in message for a in advice), message
    if during != "send":
        assert "resend the same batch with the same producer" not in message


def test_an_unreachable_store_keeps_its_own_error_and_the_paths_advice() -> None:
    text = "Generic S3 error:\n\x1b[31m↳\x1b[0m error sending request\n ↳ connection reset by peer"
    error = storage_fault(OSError(text), table="queue 'orders'", uri="s3://b/q", during="commit")
    assert isinstance(error, StorageUnreachableError)
    assert "\n" not in str(error) and "do not resend the same batch blindly" in str(error)


FILE_SIZE_CHILD = """
import resource, signal, sys
from cues_platform.queues import Lake
from cues_platform.errors import CuesError
from tests.support import rows
root, writer = sys.argv[1:3]
n = 40_000 if writer == "big-append" else 5000
if writer == "big-append":  # a file per core on threads (queues/parallel_files.py), on any machine
    from cues_platform.queues import parallel_files
    parallel_files.cores = lambda: 2
q = Lake(root=root).queue("orders")
producer = q.producer(producer_id="p") if writer == "producer" else None
if producer is not None:
    producer.open()  # its epoch is committed before the limit
send = (lambda: q.append(rows(2, n), partition="0")) if producer is None else (
    lambda: producer.send(rows(2, n), partition="0"))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))
try:
    send()
except CuesError as exc:
    print(type(exc).__name__, "|", exc)
# space again: follow the advice of the message
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
if producer is None:
    assert q.next_offset("0") == 2  # it did not land: send it
    print("ranges", q.append(rows(2, n), partition="0").ranges["0"])
else:
    print("ranges", producer.send(rows(2, n), partition="0").ranges["0"])  # the same batch
"""


@pytest.mark.parametrize("writer", ["append", "big-append", "producer"])
def test_a_file_size_limit_is_one_line_naming_the_cause_and_advice_of_the_writer(
        lake, run_python, writer) -> None:
    """ENOSPC's kind without filling a disk: RLIMIT_FSIZE in a child (SIGXFSZ ignored, so the
    write fails with EFBIG, 'File too large') makes the batch's data file unwritable. A plain
    append is told to find out whether it landed and never to resend blindly; a producer's send
    is told to resend the same batch with the same producer. Following either advice once space
    is back writes the batch exactly once. ``big-append``: 40,000 rows, whose files the appender
    writes on threads (``parallel_files.py``): the same one line, the same advice."""
    n = 40_000 if writer == "big-append" else 5000
    q = lake.create_queue("orders", schema=PAYLOAD)
    q.append(rows(0, 2), partition="0")
    proc = run_python(FILE_SIZE_CHILD, lake.root, writer)
    failure, ranges = proc.stdout.strip().splitlines()
    name, _, message = failure.partition(" | ")
    assert name == StorageFullError.__name__, proc.stdout + proc.stderr
    assert "\n" not in message and "File too large" in message and "storage is full" in message
    if writer != "producer":  # a plain append: find out first, never resend blindly
        assert "do not resend the same batch blindly" in message and "Queue.next_offset" in message
        assert "resend the same batch with the same producer" not in message
    else:  # the producer's sequence makes a landed resend a no-op
        assert "resend the same batch with the same producer" in message
        assert "do not resend" not in message
    assert "Traceback" not in proc.stderr
    assert ranges == f"ranges (2, {n + 2})"
    fresh = Lake(root=lake.root).queue("orders")  # written once, dense
    got = fresh.read_arrow(partition="0")
    assert got["id"].to_pylist() == list(range(n + 2))
    assert got["_offset"].to_pylist() == list(range(n + 2))


@pytest.fixture
def small_mount(tmp_path):
    """A 16 MiB tmpfs (root) that tests can fill or remount read-only; unmounted at the end."""
    if os.geteuid() != 0:
        yield None
        return
    where = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"as root, a tmpfs must be mountable here: {mounted.stderr}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def _make_read_only(root: Path, mount: Path | None) -> None:
    if mount is None:  # not root: permissions are enforced
        for d, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                os.chmod(Path(d, name), 0o555 if Path(d, name).is_dir() else 0o444)
        os.chmod(root, 0o555)
    else:  # root ignores chmod: a read-only file system
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)


def test_a_read_only_lake_is_one_line_naming_the_cause(tmp_path, small_mount) -> None:
    root = (small_mount or tmp_path) / "lake"
    lake = Lake(root=str(root))
    q = lake.create_queue("orders", schema=PAYLOAD)
    q.append(rows(0, 2), partition="0")
    q.tailer("billing", partition="0").commit(1)
    _make_read_only(root, small_mount)
    fresh = Lake(root=str(root)).queue("orders")
    assert fresh.read_arrow(partition="0")["id"].to_pylist() == [0, 1]  # reads still work
    for call in (lambda: fresh.append(rows(2, 1), partition="0"),
                 lambda: fresh.tailer("billing", partition="0").commit(2)):
        with pytest.raises(StorageNotWritableError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and "refuses writes" in message and not info.value.retryable
        assert "Read-only file system" in message or "ermission denied" in message
    assert fresh.tailer("billing", partition="0").position == 1
