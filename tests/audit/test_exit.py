"""Issue 22 item 7: the exit code of an audit is its verdict, every time.

An audit that meets a garbled data file reports it and goes on, but the failed Delta scan leaves
reads queued on Arrow's I/O threads; before :mod:`cues_platform.audit.exit`, 3 of 30 such audits
died at interpreter exit with code 134 ("terminate called without an active exception") after
printing their report. Real subprocesses, no Spark: the lakes are written with the queue API.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from cues_platform.audit.exit import exit_with, owns_process, run_and_exit
from cues_platform.processing import BackingQueue, Range, Record, RecordType
from cues_platform.processing.backing import Snapshot
from cues_platform.processing.outputs import commit_once
from cues_platform.queues import Lake
from tests.support import ROOT

ROWS = pa.schema([pa.field("id", pa.int64())])
STEPS = 40
RUNS = 20  # at the measured 10% crash rate, 20 runs all exiting 1 by chance: 0.9**20 = 12%


def lake_of(root: Path, *, garble: bool) -> Path:
    """``p`` read orders [0, 400) in 40 steps and wrote each step's 10 rows to ``out`` (40 data
    files); ``garble``: every third data file of ``out`` keeps its size but not its content."""
    lake = Lake(root=str(root))
    for name in ("orders", "out"):
        lake.create_queue(name, schema=ROWS, partitions=("0",))
    backing = BackingQueue(lake, "p")
    epoch = backing.fence()
    for step in range(STEPS):
        ids = pa.table({"id": list(range(10 * step, 10 * step + 10))}, schema=ROWS)
        lake.queue("orders").append(ids, partition="0")
        snapshot = Snapshot("p", step, {"orders": Range("orders", "0", 10 * step, 10 * step + 10)})
        commit_once(lake.queue("out"), snapshot, {"0": ids}, prepared=False)  # rows + proc:p
        backing.append(Record(RecordType.ATTEMPT_OUTPUT, snapshot, epoch, {"rows": {"out": {"0": 10}}}))
    if garble:
        for data in sorted((root / "queues" / "out").rglob("*.parquet"))[::3]:
            body = bytearray(data.read_bytes())
            body[4:-8] = b"Z" * (len(body) - 12)
            data.write_bytes(bytes(body))
    return root


def audit_process(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cues_platform.audit", "--lake", str(root)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_audit_of_a_damaged_lake_exits_1_and_of_a_clean_one_0(tmp_path: Path) -> None:
    damaged = lake_of(tmp_path / "damaged", garble=True)
    clean = lake_of(tmp_path / "clean", garble=False)
    codes = []
    for _ in range(RUNS):
        done = audit_process(damaged)
        codes.append(done.returncode)
        assert "terminate called" not in done.stderr, done.stderr
        assert "FAILED" in done.stdout and "[unreadable] out" in done.stdout, done.stdout
    assert codes == [1] * RUNS
    for _ in range(3):
        done = audit_process(clean)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert f"audit of lake {clean}: OK" in done.stdout


def test_in_process_callers_get_system_exit_not_a_killed_process() -> None:
    assert not owns_process()  # pytest captures the standard streams
    with pytest.raises(SystemExit) as info:
        exit_with(1)
    assert info.value.code == 1
    with pytest.raises(SystemExit) as info:
        run_and_exit(lambda: 0)
    assert info.value.code == 0
    with pytest.raises(SystemExit) as info:
        run_and_exit(lambda: sys.exit(1))
    assert info.value.code == 1


def test_a_hard_exit_keeps_the_verdict_and_the_printed_report(tmp_path: Path) -> None:
    code = ("from cues_platform.audit.exit import run_and_exit\n"
            "def report():\n"
            "    print('x' * 100_000, end='')\n"  # buffered: lost if os._exit did not flush
            "    raise SystemExit(1)\n"
            "run_and_exit(report)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, len(done.stdout)) == (1, 100_000)
    crash = subprocess.run([sys.executable, "-c", code.replace("raise SystemExit(1)", "1 / 0")],
                           capture_output=True, text=True, timeout=60)
    assert crash.returncode == 1 and "ZeroDivisionError" in crash.stderr
