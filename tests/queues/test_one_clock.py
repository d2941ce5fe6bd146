"""Issue 23 item 5, "one clock": maintenance's age rules read the platform's clock
(``cues_platform.clock.now_ms``), and a clock running ahead never deletes live data.

* Log retention (``maintenance.checkpoint`` -> ``trim_expired_log``): entries below the
  second-newest checkpoint whose commit is older than ``delta.logRetentionDuration`` by the
  platform's clock. A clock a year ahead deletes old entries; every row still loads.
* Vacuum horizon (``maintenance.vacuum`` -> ``delta_retention_hours``): delta-rs judges ages by
  the real clock, so the retention it gets is shifted by the platform clock's lead, never below
  ``MIN_SAFE_RETENTION_HOURS`` of real time: a file compaction just removed and a file an
  in-flight append wrote survive a clock two days (or a year) ahead.

Real queues on a local disk; file ages are real modification times (``os.utime``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given
from hypothesis import strategies as st

from cues_platform import clock
from cues_platform.errors import ConfigurationError
from cues_platform.queues import Lake
from cues_platform.queues.by_reference import commit_files, read_footer, verify_written
from cues_platform.queues.maintenance import (
    DEFAULT_LOG_RETENTION_MS,
    MIN_SAFE_RETENTION_HOURS,
    STEP_RECORD_COMMIT_KEY,
    checkpoint,
    compact,
    delta_retention_hours,
    log_retention_ms,
    platform_ahead_ms,
    vacuum,
)
from cues_platform.queues.schema import METADATA_FIELDS, OFFSET, PARTITION
from tests.support import PAYLOAD, rows

HOUR_S = 3600
YEAR_S = 365 * 86_400
FILE_SCHEMA = pa.schema([*PAYLOAD, *(f for f in METADATA_FIELDS if f.name != PARTITION)])


@pytest.fixture(autouse=True)
def real_clock() -> Iterator[None]:
    clock.reset()
    yield
    clock.reset()


def _root(q) -> Path:
    return Path(q.uri.removeprefix("file://"))


def _commits(q) -> list[int]:
    return sorted(int(p.name[:20]) for p in (_root(q) / "_delta_log").glob("*.json"))


def _checkpoints(q) -> list[int]:
    return sorted({int(p.name[:20]) for p in (_root(q) / "_delta_log").glob("*.checkpoint*.parquet")})


def _queue_with_a_log(make_queue, *, commits: int = 10, **properties: str):
    q = make_queue(properties={"delta.checkpointInterval": "3", **properties})
    for i in range(commits):
        q.append(rows(i, 1), partition="0")
    return q


# -- log retention ---------------------------------------------------------------------------------
def test_a_clock_a_year_ahead_trims_old_log_entries_and_every_row_still_loads(make_queue, lake) -> None:
    q = _queue_with_a_log(make_queue)  # delta.logRetentionDuration unset: 30 days
    top = q.version()
    clock.advance(seconds=YEAR_S)

    report = checkpoint(q)

    cut = _checkpoints(q)[-2]
    assert report.checkpoint_version == top and report.log_entries_removed > 0
    assert _commits(q) == list(range(cut, top + 1))  # everything below the cut, nothing above
    fresh = Lake(root=lake.root).queue("events")
    assert fresh.read_arrow(partition="0")["id"].to_pylist() == list(range(10))
    assert fresh.next_offset("0") == 10
    for version in range(cut, top + 1):  # a reader that chose the previous checkpoint still loads
        assert DeltaTable(q.uri, version=version).version() == version
    fresh.append(rows(10, 1), partition="0")
    assert Lake(root=lake.root).queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(11))


def test_at_real_time_nothing_younger_than_the_log_retention_goes(make_queue) -> None:
    q = _queue_with_a_log(make_queue)
    before = _commits(q)
    assert checkpoint(q).log_entries_removed == 0
    assert _commits(q) == before


@pytest.mark.parametrize(("ahead_s", "trimmed"), [(HOUR_S - 120, False), (HOUR_S + 120, True)],
                         ids=["just-younger", "just-older"])
def test_the_log_retention_is_judged_by_the_platform_clock(make_queue, ahead_s, trimmed) -> None:
    """A one-hour log retention: entries committed seconds ago are kept with the clock 58 minutes
    ahead and trimmed with it 62 minutes ahead (the margins cover this test's own runtime)."""
    q = _queue_with_a_log(make_queue, **{"delta.logRetentionDuration": "interval 1 hours"})
    before = _commits(q)
    clock.advance(seconds=ahead_s)
    removed = checkpoint(q).log_entries_removed
    assert (removed > 0) is trimmed
    assert _commits(q)[0] == (_checkpoints(q)[-2] if trimmed else before[0])


def test_a_clock_ahead_never_expires_a_processor_step_record(make_queue) -> None:
    """A home queue's step commit is read by the auditor until a digest holds it: a clock a year
    ahead trims up to it and stops; it goes by age only once it is older than the retention by
    the real clock too (here: a retention of 0 hours), as ``cues queue maintain`` expects after
    digesting the home."""
    from cues_platform.processing.home import STEP_RECORD_KEY

    assert STEP_RECORD_COMMIT_KEY == STEP_RECORD_KEY
    q = make_queue(properties={"delta.checkpointInterval": "3"})
    for i in range(10):
        metadata = {STEP_RECORD_KEY: "commit"} if i == 4 else {}
        q.append(rows(i, 1), partition="0", commit_metadata=metadata)
    step_version = next(v for v in _commits(q) if STEP_RECORD_KEY in _commit_info(q, v))
    clock.advance(seconds=YEAR_S)
    assert checkpoint(q).log_entries_removed > 0
    assert _commits(q)[0] == step_version < _checkpoints(q)[-2]
    clock.reset()
    q.refresh().alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours"})
    checkpoint(q)
    assert _commits(q)[0] == _checkpoints(q)[-2] > step_version


def _commit_info(q, version: int) -> dict:
    for line in (_root(q) / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            return action["commitInfo"]
    raise AssertionError(f"version {version} has no commitInfo")


@pytest.mark.parametrize(("text", "ms"), [(None, DEFAULT_LOG_RETENTION_MS),
                                          ("interval 30 days", 30 * 86_400_000),
                                          ("interval 1 hours", 3_600_000),
                                          ("interval 0 hours", 0),
                                          ("INTERVAL 2 weeks", 14 * 86_400_000),
                                          ("interval 90 seconds", 90_000)])
def test_log_retention_reads_delta_intervals(text, ms) -> None:
    assert log_retention_ms("q", {} if text is None else {"delta.logRetentionDuration": text}) == ms


def test_an_unreadable_log_retention_is_refused_with_what_to_write() -> None:
    with pytest.raises(ConfigurationError, match="interval 30 days") as info:
        log_retention_ms("q", {"delta.logRetentionDuration": "thirty days"})
    assert info.value.queue == "q" and not info.value.retryable


# -- vacuum horizon --------------------------------------------------------------------------------
@given(retention=st.floats(min_value=0, max_value=10_000, allow_nan=False),
       ahead_ms=st.integers(min_value=-10 * YEAR_S * 1000, max_value=10 * YEAR_S * 1000))
def test_the_vacuum_horizon_is_the_platform_clocks_but_never_below_the_safe_floor(retention, ahead_ms) -> None:
    hours = delta_retention_hours(retention, ahead_ms=ahead_ms)
    assert hours == math.ceil(hours) >= min(retention, MIN_SAFE_RETENTION_HOURS)  # the floor
    assert hours >= retention - ahead_ms / 3_600_000  # never shorter than the platform clock's
    assert hours - 1 < max(min(retention, MIN_SAFE_RETENTION_HOURS), retention - ahead_ms / 3_600_000)
    assert delta_retention_hours(retention, ahead_ms=0) == math.ceil(retention)  # real time: as asked
    assert hours >= delta_retention_hours(retention, ahead_ms=ahead_ms + 3_600_000)  # monotone


def test_at_real_time_vacuum_hands_delta_rs_the_retention_itself(make_queue) -> None:
    q = make_queue()
    q.append(rows(0, 1), partition="0")
    assert platform_ahead_ms() == 0
    for retention, hours in ((1, 1), (1.5, 2), (24, 24), (168, 168)):
        assert vacuum(q, retention_hours=retention).vacuum_hours == hours
    assert vacuum(q, retention_hours=0, unsafe_allow_short_retention=True).vacuum_hours == 0
    clock.advance(seconds=YEAR_S)  # an unsafe retention the caller chose is never made shorter
    assert vacuum(q, retention_hours=0.5, unsafe_allow_short_retention=True).vacuum_hours == 1


def test_a_clock_two_days_ahead_keeps_the_files_compaction_just_removed(make_queue) -> None:
    q = make_queue()
    for i in range(6):
        q.append(rows(i, 1), partition="0")
    before_compaction = q.version()
    small = {p.name for p in _root(q).rglob("*.parquet") if "_delta_log" not in p.parts}
    assert compact(q).files_removed == 6
    clock.advance(seconds=48 * HOUR_S)

    report = vacuum(q, retention_hours=24)

    assert report.vacuum_hours == math.ceil(MIN_SAFE_RETENTION_HOURS) and report.files_vacuumed == 0
    assert small <= {p.name for p in _root(q).rglob("*.parquet")}
    # a reader that opened its snapshot before the compaction still reads every row
    old = DeltaTable(q.uri, version=before_compaction).to_pyarrow_table(columns=["id"])
    assert sorted(old["id"].to_pylist()) == list(range(6))
    # and the files are vacuumable: without the floor (an explicit unsafe retention) they go
    assert vacuum(q, retention_hours=0, unsafe_allow_short_retention=True).files_vacuumed == 6
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(6))


def _write_uncommitted(q, relative: str, offsets: list[int]) -> str:
    """A file as an append (the executors) writes it before its commit."""
    n = len(offsets)
    data = {"id": offsets, "note": [f"n{i}" for i in offsets], OFFSET: offsets,
            "_producer_id": [None] * n, "_producer_seq": [None] * n, "_delivery_hash": ["h"] * n,
            "_message_type": ["message"] * n,
            "_append_time": [datetime.fromtimestamp(clock.now_ms() / 1000, UTC)] * n,
            "_txn_id": [None] * n}
    path = _root(q) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=FILE_SCHEMA), path)
    return relative


def test_a_clock_a_year_ahead_keeps_the_file_of_an_append_about_to_commit(make_queue) -> None:
    q = make_queue()
    q.append(rows(0, 2), partition="0")
    relative = _write_uncommitted(q, "_partition=0/step-inflight/part-0.parquet", [2, 3, 4])
    written = (_root(q) / relative).read_bytes()
    clock.advance(seconds=YEAR_S)

    assert vacuum(q, retention_hours=24).files_vacuumed == 0

    assert (_root(q) / relative).read_bytes() == written
    part = verify_written(q, "0", 2, [read_footer(q, relative)])  # the append commits after all
    commit_files(q, {"0": part})
    assert q.read_arrow(partition="0")["id"].to_pylist() == [0, 1, 2, 3, 4]


def test_vacuum_judges_file_ages_by_the_platform_clock(make_queue) -> None:
    """An unreferenced file 30 hours old (real time) under a 48-hour retention: kept at real
    time, deleted with the clock a day ahead (54 hours old by it), kept with the clock two days
    behind (the retention grows: a clock behind real time only keeps files longer)."""
    q = make_queue()
    q.append(rows(0, 1), partition="0")
    orphan = _root(q) / _write_uncommitted(q, "_partition=0/failed-append/part-0.parquet", [1])
    past = time.time() - 30 * HOUR_S
    os.utime(orphan, (past, past))

    assert vacuum(q, retention_hours=48).files_vacuumed == 0 and orphan.exists()
    clock.advance(seconds=-48 * HOUR_S)
    assert vacuum(q, retention_hours=48).vacuum_hours == 96 and orphan.exists()
    clock.reset()
    clock.advance(seconds=24 * HOUR_S)
    report = vacuum(q, retention_hours=48)
    assert report.vacuum_hours == 24 and report.files_vacuumed == 1 and not orphan.exists()
    assert q.read_arrow(partition="0")["id"].to_pylist() == [0]


# -- stamps ----------------------------------------------------------------------------------------
def test_a_by_reference_commit_stamps_its_add_actions_with_the_platform_clock(make_queue) -> None:
    q = make_queue()
    clock.advance(seconds=YEAR_S)
    relative = _write_uncommitted(q, "_partition=0/step-x/part-0.parquet", [0, 1])
    low = clock.now_ms()
    version = commit_files(q, {"0": verify_written(q, "0", 0, [read_footer(q, relative)])}).version
    high = clock.now_ms()
    adds = [json.loads(line)["add"] for line in
            (_root(q) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
            if line.startswith('{"add"')]
    assert len(adds) == 1 and low <= adds[0]["modificationTime"] <= high
