"""Step 5 of the audit: a table that cannot be opened or read, or whose log is damaged or
disagrees with its files, is a violation naming the table and the file, never skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cues_platform.audit import AuditReport, audit
from cues_platform.queues import Lake


def newest_commit(table: Path) -> Path:
    return sorted((table / "_delta_log").glob("*.json"))[-1]


def storage_kinds(report: AuditReport) -> set[str]:
    return {v.kind for v in report.violations} & {"unreadable", "corrupt_log"}


def test_emptied_newest_commit_is_a_corrupt_log(lake_copy: Lake) -> None:
    commit = newest_commit(Path(lake_copy.root) / "queues" / "orders")
    commit.write_bytes(b"")  # its 30 orders vanish, and the next append would reuse their offsets
    report = audit(lake_copy)
    assert not report.ok
    (v,) = report.by_kind("corrupt_log")
    assert (v.queue, v.file) == ("orders", str(commit)) and "is empty" in v.message


def test_truncated_commit_of_a_backing_queue_is_unreadable(lake_copy: Lake) -> None:
    commit = newest_commit(Path(lake_copy.root) / "_cues" / "backing" / "split")
    commit.write_bytes(commit.read_bytes()[:50])
    report = audit(lake_copy)
    (v,) = report.by_kind("unreadable")
    assert (v.queue, v.processor) == ("backing/split", "split")
    assert v.file == str(commit) and "is damaged" in v.message and "\n" not in v.message
    assert "enrich" in report.processors and "split" not in report.processors


def test_missing_data_file_of_an_input_queue_is_unreadable(lake_copy: Lake) -> None:
    (data,) = (Path(lake_copy.root) / "queues" / "orders").rglob("*.parquet")
    data.unlink()
    report = audit(lake_copy)
    assert storage_kinds(report) == {"unreadable"}
    (v,) = report.by_kind("unreadable")
    assert (v.queue, v.file) == ("orders", str(data)) and "is missing" in v.message


def test_folder_with_data_and_no_log_is_unreadable(lake_copy: Lake) -> None:
    shutil.rmtree(Path(lake_copy.root) / "queues" / "orders" / "_delta_log")
    report = audit(lake_copy)
    (v,) = report.by_kind("unreadable")
    assert v.queue == "orders" and "no Delta log" in v.message


def test_log_that_disagrees_with_its_files_is_a_corrupt_log(lake_copy: Lake) -> None:
    # The newest commit of orders keeps its part:0 app transaction but loses its add action.
    commit = newest_commit(Path(lake_copy.root) / "queues" / "orders")
    lines = [line for line in commit.read_text().splitlines() if "add" not in json.loads(line)]
    commit.write_text("\n".join(lines) + "\n")
    report = audit(lake_copy)
    (v,) = report.by_kind("corrupt_log")
    assert (v.queue, v.partition) == ("orders", "0") and "next offset is 30" in v.message


def test_a_truncated_commit_of_the_positions_table_fails_the_audit_naming_it(lake_copy: Lake) -> None:
    """The review: with the positions table damaged, ``cues audit`` exited 0. A tailer's
    committed position lost to damage is never passed as OK; the damaged file is named, not a
    healthy one."""
    lake_copy.queue("orders").tailer("t", partition="0").commit(5)
    commit = newest_commit(Path(lake_copy.root) / "_cues" / "positions")
    commit.write_bytes(commit.read_bytes()[:40])
    report = audit(lake_copy)
    assert not report.ok
    found = [v for v in report.violations if v.queue == "_cues/positions"]
    assert found and {v.file for v in found} == {str(commit)}, [v.message for v in found]


def test_a_torn_checkpoint_of_a_queue_is_reported_even_where_the_table_loads(lake_copy: Lake) -> None:
    """Opening falls back to an older checkpoint when every later commit is there (nothing is
    lost), but the damage is reported: an audit never calls a damaged lake clean."""
    q = lake_copy.queue("orders")
    q.table.create_checkpoint()
    (checkpoint,) = (Path(q.uri) / "_delta_log").glob("*.checkpoint.parquet")
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    report = audit(lake_copy)
    (v,) = [v for v in report.by_kind("corrupt_log") if v.queue == "orders"]
    assert "damaged checkpoint" in v.message and "nothing is lost" in v.message
    assert v.file == str(checkpoint)
