"""The auditor proves positions (issue 22): offsets skipped or read twice between two steps of a
lane, or across the lanes of a family after a redeployment, and a stored position that its history
does not explain, are violations, never OK.

The histories are written the way the stepper writes them (``home.commit_step``: one home commit
per step with the snapshot in its metadata and ``pos:{p}:{queue}/{partition}`` app transactions),
without Spark: nil steps, so a step is its home commit.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from cues_platform.audit import AuditReport, audit
from cues_platform.processing import BackingQueue, Range, RecordType
from cues_platform.processing.backing import Snapshot
from cues_platform.processing.home import commit_step, fence_home
from cues_platform.queues import Lake
from cues_platform.queues.appender import append_batches
from cues_platform.queues.layout import LANE_POSITION

ROWS = pa.schema([pa.field("id", pa.int64())])


class History:
    """A lake with input ``a`` (partitions 0 and x), side input ``rates/0`` and home ``out``."""

    def __init__(self, root: Path, *, a: int = 40, rates: int = 5) -> None:
        self.lake = Lake(root=str(root))
        self.lake.create_queue("a", schema=ROWS, partitions=("0", "x"))
        self.lake.create_queue("rates", schema=ROWS, partitions=("0",))
        self.lake.create_queue("out", schema=ROWS, partitions=("0", "x"))
        for part in ("0", "x"):
            self.lake.queue("a").append(pa.table({"id": list(range(a))}, schema=ROWS), partition=part)
        self.lake.queue("rates").append(pa.table({"id": list(range(rates))}, schema=ROWS), partition="0")
        self.epochs: dict[str, int] = {}
        self.steps: dict[str, int] = {}

    def step(self, pid: str, alts: str | None = None, **reads: tuple[str, int, int]) -> Snapshot:
        """One delivered (nil) step of ``pid`` reading ``binding=(queue/partition, start, end)``."""
        if pid not in self.epochs:
            self.epochs[pid] = BackingQueue(self.lake, pid).fence()
            assert fence_home(self.lake.queue("out"), pid, self.epochs[pid]) is None
        inputs = {}
        for binding, (where, start, end) in reads.items():
            queue, part = where.split("/")
            inputs[binding] = Range(queue, part, start, end)
        step = self.steps.get(pid, 0)
        self.steps[pid] = step + 1
        snapshot = Snapshot(pid, step, inputs, alts)
        commit_step(self.lake.queue("out"), snapshot, {}, epoch=self.epochs[pid],
                    outcome=RecordType.ATTEMPT_NIL, rows={}, is_record=True)
        return snapshot

    def store_position(self, pid: str, where: str, value: int) -> None:
        """What a faulty migration would do: a position written with no step."""
        queue, part = where.split("/")
        append_batches(self.lake.queue("out"), {}, allow_empty=True,
                       app_transactions=[(LANE_POSITION.id(pid, queue, part), value)])

    def audit(self) -> AuditReport:
        return audit(self.lake)


def kinds(report: AuditReport) -> set[str]:
    return {v.kind for v in report.violations}


@pytest.fixture
def h(tmp_path: Path) -> History:
    return History(tmp_path / "lake")


def lanes_before_redeploy(h: History, *, p_end: int, x_end: int) -> None:
    """``In("a")``: lane p reads a/0, lane p.x reads a/x, 10 offsets a step."""
    for start in range(0, p_end, 10):
        h.step("p", src=("a/0", start, start + 10))
    for start in range(0, x_end, 10):
        h.step("p.x", src=("a/x", start, start + 10))


# -- the two reproductions of issue 22 ------------------------------------------------------------
def test_position_of_partition_0_carried_to_x_skips_what_lane_x_left(h: History) -> None:
    lanes_before_redeploy(h, p_end=30, x_end=10)
    assert h.audit().ok, h.audit().to_text()
    h.step("p", src=("a/x", 30, 40))  # redeployed as In("a", "x"): p's position 30 applied to x
    report = h.audit()
    (v,) = report.violations
    assert (v.kind, v.processor, v.queue, v.partition, v.offsets) == ("gap", "p", "a", "x", (10, 30))
    assert "'p.x' of the same family ended at 10" in v.message


def test_position_behind_the_lane_that_read_x_delivers_twice(h: History) -> None:
    lanes_before_redeploy(h, p_end=10, x_end=30)
    h.step("p", src=("a/x", 10, 20))  # p.x ahead: p's position 10 applied to x
    (v,) = h.audit().violations
    assert (v.kind, v.processor, v.queue, v.partition, v.offsets) == ("overlap", "p", "a", "x", (10, 20))
    assert "'p.x' of the same family read it up to 30" in v.message


def test_a_carried_position_with_no_step_yet_is_a_violation(h: History) -> None:
    lanes_before_redeploy(h, p_end=30, x_end=10)
    h.store_position("p", "a/x", 30)  # the next step of p would start a/x at 30
    (v,) = h.audit().violations
    assert (v.kind, v.processor, v.queue, v.partition) == ("position", "p", "a", "x")
    assert "never read that partition" in v.message and "[10]" in v.message


def test_a_lane_that_reads_another_lanes_partition_from_0_delivers_twice(h: History) -> None:
    lanes_before_redeploy(h, p_end=20, x_end=10)
    h.step("p", src=("a/x", 0, 10))  # keyed positions, but nothing handed over: starts at 0
    (v,) = h.audit().violations
    assert (v.kind, v.processor, v.queue, v.partition, v.offsets) == ("overlap", "p", "a", "x", (0, 10))
    assert "lane 'p.x''s own partition" in v.message


# -- what is not a violation ----------------------------------------------------------------------
def test_a_side_input_read_by_every_lane_from_0_is_clean(h: History) -> None:
    for pid, part in (("p", "0"), ("p.x", "x")):
        h.step(pid, src=(f"a/{part}", 0, 10), rates=("rates/0", 0, 5))
        h.step(pid, src=(f"a/{part}", 10, 20), rates=("rates/0", 5, 5))
    report = h.audit()
    assert report.ok, report.to_text()


def test_a_redeploy_that_continues_where_the_lane_stopped_is_clean(h: History) -> None:
    lanes_before_redeploy(h, p_end=30, x_end=10)
    h.store_position("p", "a/x", 10)  # handed over before p's first step on x: allowed
    assert h.audit().ok, h.audit().to_text()
    h.step("p", src=("a/x", 10, 25))
    h.step("p", src=("a/x", 25, 40))
    report = h.audit()
    assert report.ok, report.to_text()


def test_alts_positions_carried_by_empty_ranges_are_clean_and_a_moved_one_is_a_gap(h: History) -> None:
    h.step("q", alts="left", left=("a/0", 0, 10), right=("rates/0", 0, 0))
    h.step("q", alts="right", left=("a/0", 10, 10), right=("rates/0", 0, 5))
    assert h.audit().ok, h.audit().to_text()
    h.step("q", alts="left", left=("a/0", 12, 20), right=("rates/0", 5, 5))
    (v,) = h.audit().violations
    assert (v.kind, v.processor, v.queue, v.partition, v.offsets, v.step) == (
        "gap", "q", "a", "0", (10, 12), 2)


# -- one lane ---------------------------------------------------------------------------------------
def test_offsets_skipped_between_two_steps_of_one_lane(h: History) -> None:
    h.step("p", src=("a/0", 0, 10))
    h.step("p", src=("a/0", 15, 20))
    (gap,) = h.audit().violations  # the stored position (20) is the last step's end: no more
    assert gap.kind == "gap"
    assert (gap.processor, gap.queue, gap.partition, gap.offsets, gap.step) == ("p", "a", "0", (10, 15), 1)


def test_offsets_read_again_by_the_next_step_of_one_lane(h: History) -> None:
    h.step("p", src=("a/0", 0, 10))
    h.step("p", src=("a/0", 5, 20))
    (v,) = h.audit().by_kind("overlap")
    assert (v.processor, v.queue, v.partition, v.offsets, v.step) == ("p", "a", "0", (5, 10), 1)


def test_steps_out_of_order_are_a_violation_even_when_every_offset_is_read_once(h: History) -> None:
    h.step("p", src=("a/0", 10, 20))
    h.step("p", src=("a/0", 0, 10))
    assert {"gap", "overlap"} <= kinds(h.audit())


def test_a_stored_position_that_disagrees_with_the_last_step(h: History) -> None:
    h.step("p", src=("a/0", 0, 10))
    h.store_position("p", "a/0", 25)
    (v,) = h.audit().violations
    assert (v.kind, v.processor, v.queue, v.partition, v.offsets) == ("position", "p", "a", "0", (10, 25))
