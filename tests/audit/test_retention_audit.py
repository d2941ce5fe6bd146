"""The auditor knows start offsets (issue 23 item 1): rows below a partition's start offset are
retained-away, not lost, and exactly-once is still proven for everything at or above it.

The Spark lake (``lake_copy``: enrich (map) orders -> enriched + errors, split (fork) enriched ->
big + small, every offset consumed) is retained with ``queues.retention.delete_below`` after the
processors consumed it, as maintenance would. The histories without Spark are written the way
the stepper writes them (``home.commit_step``), as in ``test_positions.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from cues_platform.audit import AuditReport, audit
from cues_platform.processing import BackingQueue, Range, Record, RecordType
from cues_platform.processing.backing import Snapshot
from cues_platform.processing.home import commit_step, fence_home
from cues_platform.queues import Lake, Queue
from cues_platform.queues.retention import RETENTION_METADATA_KEY, delete_below
from tests.audit.lakes import attempts, only

ROWS = pa.schema([pa.field("id", pa.int64())])


def kinds(report: AuditReport) -> set[str]:
    return {v.kind for v in report.violations}


def retain_everything_consumed(lake: Lake) -> None:
    """What retention may remove once enrich and split consumed every offset: orders [0, 30),
    enriched [0, 20), and the outputs nobody reads (errors, big, small) in full."""
    for name in ("orders", "enriched", "errors", "big", "small"):
        q = lake.queue(name)
        delete_below(q, {"0": q.next_offset("0")})


# -- (1) a retained graph audits clean ---------------------------------------------------------------
def test_consumed_prefix_of_inputs_and_outputs_retained_audits_clean(lake_copy: Lake) -> None:
    ends = {n: lake_copy.queue(n).next_offset("0") for n in ("orders", "enriched", "errors")}
    assert ends == {"orders": 30, "enriched": 20, "errors": 1}
    retain_everything_consumed(lake_copy)
    assert lake_copy.queue("orders").read_arrow(partition="0").num_rows == 0
    report = audit(lake_copy)
    assert report.ok, report.to_text()
    assert report.retained_below["orders"] == {"0": 30}
    assert report.retained_below["enriched"] == {"0": 20}
    assert report.retained_below["errors"] == {"0": 1}
    # every delivered step read rows that are gone: 3 ranges of enrich, 2 of split
    assert report.retained_steps["input_ranges_below_start"] == 5
    # enrich 0, 1 (one-commit: proven by their commits), enrich 2 (error rows: a backing attempt,
    # proven by proc:enrich on errors), split 0 (big and small: proven by proc:split)
    assert report.retained_steps["output_steps_committed"] == 4
    assert report.retained_steps["output_steps_by_order"] == 0
    enrich = report.processors["enrich"]
    assert enrich.steps_delivered == 3 and enrich.pending is None and enrich.lag == 0
    assert report.processors["split"].steps_delivered == 2
    text = report.to_text()
    assert "orders/0 [0, 30)" in text and "checked only structurally" in text
    body = json.loads(report.to_json())
    assert body["retained_below"]["enriched"] == {"0": 20}


def test_the_retention_commit_passes_every_log_check(lake_copy: Lake) -> None:
    """A cut through the middle of a file: the delete rewrites it with its rows above the cut
    (an add action in a commit without cues.ranges) and the step that straddles the start keeps
    its upper rows as one run starting at the start."""
    enriched = lake_copy.queue("enriched")
    (moved,) = delete_below(enriched, {"0": 15})  # step 1 wrote [10, 20): [15, 20) stay
    assert (moved.old_start, moved.new_start) == (0, 15)
    newest = sorted((Path(enriched.uri) / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in newest.read_text().splitlines() if line.strip()]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert json.loads(info[RETENTION_METADATA_KEY]) == {"0": [0, 15]}
    assert any("add" in a for a in actions), "the cut went through a file: it was rewritten"
    report = audit(lake_copy)
    assert report.ok, report.to_text()
    assert report.retained_below == {"enriched": {"0": 15}}
    assert report.retained_steps["output_steps_committed"] == 2  # step 0 whole, step 1 in part


def test_a_duplicate_above_the_start_is_still_delivered_twice(lake_copy: Lake) -> None:
    step1 = attempts(lake_copy, "enrich")[1]
    enriched = lake_copy.queue("enriched")
    rows = enriched.read_arrow(partition="0")
    mine = rows.filter(pc.equal(rows["_delivery_hash"], step1.hash))
    delete_below(enriched, {"0": 15})
    delete_below(lake_copy.queue("orders"), {"0": 30})
    end = enriched.next_offset("0")
    enriched.append(mine.select(enriched.payload_schema.names), partition="0",
                    delivery_hash=step1.hash)
    (v,) = only(audit(lake_copy), "delivered_twice")
    # the copy follows the kept rows [15, 20) directly: one run [15, 30) of 15 rows where the
    # attempt recorded 10, so the last 5 are named (how many of the step's rows are below the
    # start the lake cannot say; that the step is delivered twice, it can)
    assert (v.queue, v.partition, v.offsets, v.step) == ("enriched", "0", (end + 5, end + 10), 1)
    assert "15 rows with its hash where the attempt recorded 10" in v.message


# -- (2) rows gone without a start: the audit fails naming them ---------------------------------------
def test_a_plain_delete_below_with_no_start_fails_naming_the_offsets(lake_copy: Lake) -> None:
    orders = lake_copy.queue("orders")
    DeltaTable(orders.uri).delete("_offset < 10")  # not retention: no start:0 transaction
    report = audit(lake_copy)
    (v,) = only(report, "corrupt_log")
    assert (v.queue, v.partition, v.offsets) == ("orders", "0", (0, 10))
    assert "start offset is 0" in v.message and "retention" in v.message
    assert report.retained_below == {}


def test_a_plain_delete_above_the_start_fails_naming_the_offsets(lake_copy: Lake) -> None:
    orders = lake_copy.queue("orders")
    delete_below(orders, {"0": 20})
    DeltaTable(orders.uri).delete("_offset >= 24 AND _offset < 27")
    report = audit(lake_copy)
    (v,) = only(report, "corrupt_log")
    assert (v.queue, v.partition, v.offsets) == ("orders", "0", (24, 27))
    assert "at or above its start offset 20" in v.message


def test_a_plain_delete_of_output_rows_above_the_start_fails(lake_copy: Lake) -> None:
    enriched = lake_copy.queue("enriched")
    delete_below(enriched, {"0": 5})
    DeltaTable(enriched.uri).delete("_offset >= 12 AND _offset < 14")
    report = audit(lake_copy)
    assert not report.ok
    # (a damaged table is not read further: enrich's step commits in it are not seen, so its
    # history shows as out of sequence too, as for any damaged home queue)
    (v,) = report.by_kind("corrupt_log")
    assert (v.queue, v.partition, v.offsets) == ("enriched", "0", (12, 14))
    assert "at or above its start offset 5" in v.message


# -- (3) histories without Spark -----------------------------------------------------------------------
class History:
    """Input ``a`` (partition 0, 40 rows) and home ``out`` of processor lanes, steps written as the
    stepper writes them: one home commit each (rows included), or a backing attempt closed by
    a home commit."""

    def __init__(self, root: Path) -> None:
        self.lake = Lake(root=str(root))
        self.lake.create_queue("a", schema=ROWS, partitions=("0",))
        self.lake.create_queue("out", schema=ROWS, partitions=("0",))
        self.lake.queue("a").append(pa.table({"id": list(range(40))}, schema=ROWS), partition="0")
        self.epochs: dict[str, int] = {}
        self.steps: dict[str, int] = {}

    def _snapshot(self, pid: str, start: int, end: int) -> Snapshot:
        if pid not in self.epochs:
            self.epochs[pid] = BackingQueue(self.lake, pid).fence()
            assert fence_home(self.lake.queue("out"), pid, self.epochs[pid]) is None
        step = self.steps.get(pid, 0)
        self.steps[pid] = step + 1
        return Snapshot(pid, step, {"src": Range("a", "0", start, end)}, None)

    def step(self, pid: str, start: int, end: int, *, rows: int = 0) -> Snapshot:
        """A one-commit step reading a/0 [start, end) that writes ``rows`` rows to out/0."""
        snap = self._snapshot(pid, start, end)
        tables = {"0": pa.table({"id": list(range(rows))}, schema=ROWS)} if rows else {}
        outcome = RecordType.ATTEMPT_OUTPUT if rows else RecordType.ATTEMPT_NIL
        commit_step(self.lake.queue("out"), snap, tables, epoch=self.epochs[pid], outcome=outcome,
                    rows={"out": {"0": rows}} if rows else {}, is_record=True)
        return snap

    def lost_step(self, pid: str, start: int, end: int, *, rows: int) -> Snapshot:
        """A backing attempt recording ``rows`` rows for out/0 whose rows were never committed
        (the home commit that closes it carries none): a lost output."""
        snap = self._snapshot(pid, start, end)
        recorded = {"rows": {"out": {"0": rows}}}
        BackingQueue(self.lake, pid).append(
            Record(RecordType.ATTEMPT_OUTPUT, snap, self.epochs[pid], recorded))
        commit_step(self.lake.queue("out"), snap, {}, epoch=self.epochs[pid],
                    outcome=RecordType.ATTEMPT_OUTPUT, rows={}, is_record=False)
        return snap

    def retain(self, queue: str, cut: int) -> None:
        delete_below(self.lake.queue(queue), {"0": cut})

    @staticmethod
    def retain_queue(queue: Queue, cut: int) -> None:
        delete_below(queue, {"0": cut})

    def audit(self) -> AuditReport:
        return audit(self.lake)


@pytest.fixture
def h(tmp_path: Path) -> History:
    return History(tmp_path / "lake")


def test_ranges_partly_below_the_start_are_clean_and_counted(h: History) -> None:
    for start in range(0, 30, 10):
        h.step("p", start, start + 10)
    h.retain("a", 15)  # [10, 20) is partly below the start
    report = h.audit()
    assert report.ok, report.to_text()
    assert report.retained_below == {"a": {"0": 15}}
    assert report.retained_steps["input_ranges_below_start"] == 2
    (lag,) = report.processors["p"].inputs
    assert (lag.delivered_end, lag.available, lag.lag) == (30, 40, 10)


def test_a_range_read_twice_above_the_start_is_still_an_overlap(h: History) -> None:
    h.step("p", 0, 10)
    h.step("p", 10, 20)
    h.retain("a", 15)
    h.step("p", 17, 25)  # [17, 20) again, above the start
    (v,) = only(h.audit(), "overlap")
    assert (v.queue, v.partition, v.offsets, v.step) == ("a", "0", (17, 20), 2)


def test_offsets_skipped_above_the_start_are_still_a_gap(h: History) -> None:
    h.step("p", 0, 10)
    h.retain("a", 5)
    h.step("p", 12, 20)
    (v,) = only(h.audit(), "gap")
    assert (v.queue, v.partition, v.offsets) == ("a", "0", (10, 12))


def test_a_lane_deployed_after_retention_starts_at_the_start_offset(h: History) -> None:
    h.step("p", 0, 20)
    h.retain("a", 20)
    h.step("q", 20, 30)  # a new processor: starts where the partition starts
    report = h.audit()
    assert report.ok, report.to_text()


def test_a_new_lane_starting_above_the_start_skipped_offsets_that_are_there(h: History) -> None:
    h.step("p", 0, 20)
    h.retain("a", 20)
    h.step("q", 25, 30)
    (v,) = only(h.audit(), "gap")
    assert (v.processor, v.queue, v.offsets) == ("q", "a", (20, 25))  # not [0, 25)
    assert "[0, 20) are retained-away" in v.message


def test_output_rows_below_the_start_are_retained_proven_by_their_commits(h: History) -> None:
    for i in range(3):
        h.step("p", i * 10, i * 10 + 10, rows=5)  # out/0: [0, 5) [5, 10) [10, 15)
    h.retain("out", 12)  # steps 0 and 1 whole, step 2 keeps [12, 15)
    report = h.audit()
    assert report.ok, report.to_text()
    assert report.retained_below == {"out": {"0": 12}}
    assert report.retained_steps["output_steps_committed"] == 3
    assert report.processors["p"].steps_delivered == 3


def test_a_lost_output_below_the_start_is_caught_by_the_count(h: History) -> None:
    h.step("p", 0, 10, rows=5)  # out/0 [0, 5)
    h.lost_step("p", 10, 20, rows=50)  # records 50 rows: none were committed
    h.step("p", 20, 30, rows=5)  # out/0 [5, 10)
    assert kinds(h.audit()) == {"undelivered", "gap"}  # before retention, the loss is plain
    h.retain("out", 7)
    (v,) = only(h.audit(), "row_count_mismatch")
    assert (v.queue, v.partition, v.offsets) == ("out", "0", (0, 7))
    assert "57 row(s)" in v.message and "'p' step 1" in v.message


def test_a_backing_attempt_below_the_start_that_fits_is_checked_by_order_only(h: History) -> None:
    """What the lake cannot show: a backing attempt whose rows are gone below the start may have
    been committed or lost. The count catches a loss when every retained row was a step's; rows
    outside the protocol retained with them (here 2 without a hash, a violation while they were
    there) can hide one. The report says how many steps were checked this way."""
    h.step("p", 0, 10, rows=5)  # out/0 [0, 5)
    h.lost_step("p", 10, 20, rows=2)
    h.lake.queue("out").append(pa.table({"id": [7, 8]}, schema=ROWS), partition="0")  # [5, 7)
    h.step("p", 20, 30, rows=5)  # out/0 [7, 12)
    assert kinds(h.audit()) == {"undelivered", "gap", "no_delivery_hash"}
    h.retain("out", 9)  # 5 + 2 + 2 recorded rows of steps 0, 1, 2 fit below 9
    report = h.audit()
    assert report.ok, report.to_text()
    assert report.retained_steps["output_steps_by_order"] == 1
    assert report.retained_steps["output_steps_committed"] == 2


def test_a_last_attempt_not_yet_committed_is_pending_not_retained(h: History) -> None:
    h.step("p", 0, 10, rows=5)
    h.retain("out", 5)
    snap = h._snapshot("p", 10, 20)  # step 1: attempt recorded, commit not made yet
    BackingQueue(h.lake, "p").append(
        Record(RecordType.ATTEMPT_OUTPUT, snap, h.epochs["p"], {"rows": {"out": {"0": 3}}}))
    report = h.audit()
    assert report.ok, report.to_text()
    assert report.processors["p"].pending_step == 1
    assert report.retained_steps["output_steps_committed"] == 1


def test_a_backing_queue_retained_from_its_start_is_audited_from_its_first_record(
        h: History) -> None:
    """Retention does not apply to backing queues today; if it ever removed a backing queue's
    first records, the audit reads it from its start and says what it did not check."""
    snap = h._snapshot("p", 0, 10)  # step 0: a backing attempt (nil), closed by its home commit
    BackingQueue(h.lake, "p").append(Record(RecordType.ATTEMPT_NIL, snap, h.epochs["p"], {}))
    commit_step(h.lake.queue("out"), snap, {}, epoch=h.epochs["p"],
                outcome=RecordType.ATTEMPT_NIL, rows={}, is_record=False)
    h.step("p", 10, 20, rows=5)
    h.step("p", 20, 30, rows=5)
    assert h.audit().ok
    backing = h.lake.queue("p", uri=h.lake.system_uri("backing", "p"))
    h.retain_queue(backing, backing.next_offset("0"))
    report = h.audit()
    assert report.ok, report.to_text()
    assert report.retained_below == {"backing/p": {"0": backing.next_offset("0")}}
    assert report.processors["p"].steps_delivered == 2
    assert any("audited from step 1" in n for n in report.notes)
    h.step("p", 35, 40)  # a gap above the first remaining step is still a gap
    (v,) = only(h.audit(), "gap")
    assert v.offsets == (30, 35)
