"""Issue 22 item 7, the auditor's side: a record or a commit that names a file outside the lake,
and a step that read nothing but produced rows, fail the audit (and ``cues audit`` exits 1).

The review's forged record is written as the review wrote it (``BackingQueue.append`` of an
attempt whose step read the empty range [15, 15) and names ``evil.parquet`` outside the lake),
then delivered the way recovery delivered it before ``queues/confine.py``. No Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cues_platform.audit import audit
from cues_platform.audit.trust import staged_file_checks
from cues_platform.processing import BackingQueue, Range, Record, RecordType
from cues_platform.processing.backing import Snapshot
from cues_platform.processing.home import commit_step, fence_home
from cues_platform.processing.outputs import commit_once, stage
from cues_platform.queues import Lake
from tests.support import ROOT

ROWS = pa.schema([pa.field("id", pa.int64())])
EVIL = pa.table({"id": [666]}, schema=ROWS)


def delivered_15(root: Path) -> tuple[Lake, int]:
    """``p`` (home ``b``, second output ``c``) delivered a/0 [0, 15) in one step."""
    lake = Lake(root=str(root))
    for name in ("a", "b", "c"):
        lake.create_queue(name, schema=ROWS, partitions=("0",))
    lake.queue("a").append(pa.table({"id": list(range(15))}, schema=ROWS), partition="0")
    epoch = BackingQueue(lake, "p").fence()
    assert fence_home(lake.queue("b"), "p", epoch) is None
    commit_step(lake.queue("b"), Snapshot("p", 0, {"a": Range("a", "0", 0, 15)}), {}, epoch=epoch,
                outcome=RecordType.ATTEMPT_NIL, rows={}, is_record=True)
    assert audit(lake).ok
    return lake, epoch


def forge(lake: Lake, epoch: int, path: str, *, deliver: bool) -> Snapshot:
    snapshot = Snapshot("p", 1, {"a": Range("a", "0", 15, 15)})
    BackingQueue(lake, "p").append(Record(RecordType.ATTEMPT_OUTPUT, snapshot, epoch, {
        "files": {"c": {"0": path}}, "rows": {"c": {"0": 1}}}))
    if deliver:  # what recovery did before confine.py: the file's rows committed, then the home
        commit_once(lake.queue("c"), snapshot, {"0": pq.read_table(path)}, prepared=False)
        commit_step(lake.queue("b"), snapshot, {}, epoch=epoch, outcome=RecordType.ATTEMPT_OUTPUT,
                    rows={"c": {"0": 1}}, is_record=False)
    return snapshot


def audit_exit_code(lake: Lake) -> int:
    return subprocess.run([sys.executable, "-m", "cues_platform.audit", "--lake", lake.root],
                          cwd=ROOT, capture_output=True, text=True, timeout=120).returncode


def test_the_reviews_forged_and_delivered_record_fails_the_audit(tmp_path: Path) -> None:
    lake, epoch = delivered_15(tmp_path / "lake")
    evil = tmp_path / "evil.parquet"
    pq.write_table(EVIL, evil)
    snapshot = forge(lake, epoch, str(evil), deliver=True)
    report = audit(lake)
    (nothing,) = report.violations
    assert (nothing.kind, nothing.processor, nothing.step, nothing.queue, nothing.hash) == (
        "rows_without_input", "p", 1, "c", snapshot.delivery_hash)
    assert "a/0 [15, 15)" in nothing.message and "c/0" in nothing.message
    # a delivered attempt's staged files are gone and never read again: their names are checked
    # on request only (a moved lake's records keep its old root), and then this one is refused
    attempt = [r for r in BackingQueue(lake, "p").records() if r.step == 1]
    (outside,) = staged_file_checks(lake, "p", attempt, attempt, shape_of_delivered=True)
    assert (outside.kind, outside.step, outside.hash, outside.file) == (
        "outside_lake", 1, snapshot.delivery_hash, str(evil))
    moved = lake.system_uri("staging", "p", f"{1:012d}-{snapshot.delivery_hash[:8]}", "c--0--x.parquet")
    moved = moved.replace(lake.root, "/elsewhere/lake")
    renamed = [Record(r.type, r.snapshot, r.epoch, {"files": {"c": {"0": moved}}, "rows": r.outputs["rows"]})
               for r in attempt]
    assert staged_file_checks(lake, "p", renamed, renamed, shape_of_delivered=True) == []
    assert audit_exit_code(lake) == 1


def test_a_pending_attempt_naming_a_file_outside_the_lake_fails_the_audit(tmp_path: Path) -> None:
    lake, epoch = delivered_15(tmp_path / "lake")
    lake.queue("a").append(pa.table({"id": [15]}, schema=ROWS), partition="0")
    evil = tmp_path / "evil.parquet"
    pq.write_table(EVIL, evil)
    snapshot = Snapshot("p", 1, {"a": Range("a", "0", 15, 16)})  # reads one offset: not empty
    BackingQueue(lake, "p").append(Record(RecordType.ATTEMPT_OUTPUT, snapshot, epoch, {
        "files": {"c": {"0": str(evil)}}, "rows": {"c": {"0": 1}}}))
    report = audit(lake)
    (v,) = report.violations
    assert (v.kind, v.file, v.step) == ("outside_lake", str(evil), 1)
    assert report.processors["p"].pending_step == 1  # recovery would roll it forward: refused


def test_a_pending_attempt_naming_its_own_staged_file_is_clean(tmp_path: Path) -> None:
    lake, epoch = delivered_15(tmp_path / "lake")
    lake.queue("a").append(pa.table({"id": [15]}, schema=ROWS), partition="0")
    snapshot = Snapshot("p", 1, {"a": Range("a", "0", 15, 16)})
    staged = stage(lake, snapshot, {"c": {"0": EVIL}})
    BackingQueue(lake, "p").append(Record(RecordType.ATTEMPT_OUTPUT, snapshot, epoch, {
        "files": staged, "rows": {"c": {"0": 1}}}))
    report = audit(lake)
    assert report.ok and report.processors["p"].pending_step == 1, report.to_text()


def test_a_commit_whose_add_action_names_a_file_outside_the_table(tmp_path: Path) -> None:
    lake, _ = delivered_15(tmp_path / "lake")
    evil = tmp_path / "evil.parquet"
    pq.write_table(EVIL, evil)
    log = tmp_path / "lake" / "queues" / "a" / "_delta_log"
    newest = sorted(log.glob("*.json"))[-1]
    add = next(json.loads(line) for line in newest.read_text().splitlines() if "add" in json.loads(line))
    add["add"]["path"] = str(evil)  # an absolute path: delta-rs would read it as the queue's
    version = int(newest.stem) + 1
    (log / f"{version:020d}.json").write_text(json.dumps(add) + "\n")
    report = audit(lake)
    bad = report.by_kind("outside_lake")
    assert [(v.queue, v.file) for v in bad] == [("a", str(evil))], report.to_text()
    assert "not inside the table's folder" in bad[0].message
