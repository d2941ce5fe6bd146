"""The auditor against real lakes: a clean run of a map + fork graph on Spark, then the same lake
corrupted the way a bug would (duplicate delivery, foreign hash, skipped or re-read offsets)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cues_platform.audit import (
    AuditError,
    AuditReport,
    LakeNotFoundError,
    NoSuchProcessorError,
    audit,
    describe_backing,
)
from cues_platform.errors import CuesError
from cues_platform.processing import BackingQueue, Graph, GraphRunner, Range, Record, RecordType
from cues_platform.processing.loader import load_graph
from cues_platform.processing.runner import create_queues
from cues_platform.processing.step import Snapshot
from cues_platform.queues import Lake

# The graph is a source file so that `cues run` subprocesses load exactly the same one.
GRAPH_SOURCE = '''
"""Test graph: enrich (map) doubles amounts, split (fork) routes them by size."""
import pyarrow as pa
from pyspark.sql import functions as F

from cues_platform.processing import ERROR_SCHEMA, Graph, In, Kind, Options, Out, Processor, QueueDef

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.int64())])
ENRICHED = pa.schema([pa.field("id", pa.int64()), pa.field("amount", pa.int64()),
                      pa.field("double", pa.int64())])


def enrich(ctx, orders):
    if ctx.step == 2:
        raise ValueError("bad batch")  # handled: one row to the error queue
    return orders.select("id", "amount", (F.col("amount") * 2).alias("double"))


def split(ctx, enriched):
    if ctx.step == 1:
        return None  # a nil step
    return {"big": enriched.where(F.col("amount") >= 50).select("id", "amount"),
            "small": enriched.where(F.col("amount") < 50).select("id", "amount")}


graph = Graph.build(
    name="shop",
    queues=[QueueDef("orders", ORDERS), QueueDef("enriched", ENRICHED), QueueDef("big", ORDERS),
            QueueDef("small", ORDERS), QueueDef("errors", ERROR_SCHEMA)],
    processors=[
        Processor("enrich", Kind.MAP, enrich, {"orders": In("orders")}, {"out": Out("enriched")},
                  options=Options(batch_size=10, poll_interval=0.2)),
        Processor("split", Kind.FORK, split, {"enriched": In("enriched")},
                  {"big": Out("big"), "small": Out("small")},
                  options=Options(batch_size=10, poll_interval=0.2)),
    ],
    error_queue="errors",
)
'''
MODULE = "tests_graph_module"
ORDERS = 30  # enrich: steps 0, 1 (output) and 2 (error) over [0,10) [10,20) [20,30);
# split: step 0 (output) and 1 (nil) over enriched [0,10) [10,20)


def write_graph(folder: Path) -> Path:
    path = folder / f"{MODULE}.py"
    path.write_text(GRAPH_SOURCE)
    return path


def orders(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([i * 7 % 100 for i in ids], pa.int64()),
        }
    )


def seed(graph: Graph, lake: Lake, count: int = ORDERS) -> None:
    create_queues(graph, lake)
    lake.queue("orders").append(orders(0, count), partition="0")


@pytest.fixture(scope="module")
def clean_lake(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake after GraphRunner ran the test graph until idle (built once per module)."""
    base = tmp_path_factory.mktemp("audit")
    graph = load_graph(f"{write_graph(base)}:graph")
    lake = Lake(root=str(base / "lake"))
    seed(graph, lake)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    return base / "lake"


@pytest.fixture
def lake_copy(clean_lake: Path, tmp_path: Path) -> Lake:
    """A private copy of the clean lake, to corrupt."""
    shutil.copytree(clean_lake, tmp_path / "lake")
    return Lake(root=str(tmp_path / "lake"))


def attempts(lake: Lake, processor: str) -> list[Record]:
    return [r for r in BackingQueue(lake, processor).records() if r.is_attempt]


def append_step(
    lake: Lake,
    processor: str,
    inputs: dict[str, Range],
    *,
    alts: str | None = None,
    kind: RecordType = RecordType.ATTEMPT_NIL,
    outputs: dict | None = None,
    attempt: bool = True,
) -> Snapshot:
    """Append what a buggy processor would: the next step's snapshot and (by default) attempt."""
    backing = BackingQueue(lake, processor)
    epoch = backing.epoch()
    step = backing.last_record().step + 1
    snapshot = Snapshot(processor, step, inputs, alts)
    backing.append(Record(RecordType.SNAPSHOT, snapshot, epoch))
    if attempt:
        backing.append(Record(kind, snapshot, epoch, outputs or {}))
    return snapshot


def only(report: AuditReport, kind: str) -> list:
    assert not report.ok
    assert {v.kind for v in report.violations} == {kind}, report.to_text()
    return report.by_kind(kind)


# -- clean ------------------------------------------------------------------------------------------
def test_clean_run_audits_clean(clean_lake: Path) -> None:
    report = audit(Lake(root=str(clean_lake)))
    assert report.ok, report.to_text()
    assert report.violations == ()
    enrich, split = report.processors["enrich"], report.processors["split"]
    assert (enrich.steps_delivered, dict(enrich.outcomes)) == (3, {"output": 2, "error": 1})
    assert enrich.rows_out == {"enriched": 20, "errors": 1}
    assert [(i.queue, i.partition, i.delivered_end, i.lag) for i in enrich.inputs] == [
        ("orders", "0", 30, 0)
    ]
    assert split.outcomes.get("nil") == 1 and split.pending is None
    assert split.inputs[0].delivered_end == 20 and split.lag == 0
    assert sum(split.rows_out.values()) == 20 - 10  # the nil step read 10 rows, wrote none
    assert report.queues_checked == ("big", "enriched", "errors", "small")
    assert report.queues_not_checked == ("orders",)
    body = json.loads(report.to_json())
    assert body["ok"] is True and body["processors"]["enrich"]["steps_delivered"] == 3
    assert "audit of lake" in report.to_text() and ": OK" in report.to_text()


def test_lag_and_pending_are_reported_not_violations(lake_copy: Lake) -> None:
    lake_copy.queue("orders").append(orders(ORDERS, 12), partition="0")
    append_step(lake_copy, "enrich", {"orders": Range("orders", "0", 30, 40)}, attempt=False)
    report = audit(lake_copy)
    assert report.ok, report.to_text()
    enrich = report.processors["enrich"]
    assert enrich.pending_step == 3 and "orders/0 [30, 40)" in enrich.pending
    assert enrich.inputs[0].delivered_end == 30 and enrich.lag == 12


def test_attempt_without_commit_is_pending_when_last_and_undelivered_after(lake_copy: Lake) -> None:
    lake_copy.queue("orders").append(orders(ORDERS, 20), partition="0")
    outputs = {"files": {"enriched": {"0": "/gone.parquet"}}, "rows": {"enriched": {"0": 10}}}
    lost = append_step(
        lake_copy,
        "enrich",
        {"orders": Range("orders", "0", 30, 40)},
        kind=RecordType.ATTEMPT_OUTPUT,
        outputs=outputs,
    )
    report = audit(lake_copy)
    assert report.ok and report.processors["enrich"].pending_step == 3, report.to_text()
    append_step(lake_copy, "enrich", {"orders": Range("orders", "0", 40, 50)})
    report = audit(lake_copy)
    undelivered = report.by_kind("undelivered")
    assert [(v.queue, v.partition, v.step, v.hash) for v in undelivered] == [
        ("enriched", "0", 3, lost.delivery_hash)
    ]
    # step 3 is not delivered, so its offsets are a gap between step 2 and step 4
    assert [(v.queue, v.partition, v.offsets) for v in report.by_kind("gap")] == [
        ("orders", "0", (30, 40))
    ]


# -- corruptions ------------------------------------------------------------------------------------
def test_duplicate_copy_of_a_delivered_step_is_delivered_twice(lake_copy: Lake) -> None:
    step1 = attempts(lake_copy, "enrich")[1]
    enriched = lake_copy.queue("enriched")
    rows = enriched.read_arrow(partition="0")
    mine = rows.filter(pc.equal(rows["_delivery_hash"], step1.hash))
    assert mine.num_rows == 10
    end = enriched.next_offset("0")
    enriched.append(
        mine.select(enriched.payload_schema.names), partition="0", delivery_hash=step1.hash
    )
    (v,) = only(audit(lake_copy), "delivered_twice")
    assert (v.processor, v.queue, v.partition, v.offsets, v.hash, v.step) == (
        "enrich",
        "enriched",
        "0",
        (end, end + 10),
        step1.hash,
        1,
    )
    assert "20 rows" in v.message


def test_rows_with_a_made_up_hash_are_unknown(lake_copy: Lake) -> None:
    big = lake_copy.queue("big")
    end = big.next_offset("0")
    made_up = "f" * 32
    big.append(orders(1000, 3), partition="0", delivery_hash=made_up)
    big.append(orders(2000, 2), partition="0")  # a producer row (null hash): ignored
    (v,) = only(audit(lake_copy), "unknown_hash")
    assert (v.queue, v.partition, v.offsets, v.hash) == ("big", "0", (end, end + 3), made_up)


def test_attempt_that_skips_offsets_is_a_gap(lake_copy: Lake) -> None:
    lake_copy.queue("orders").append(orders(ORDERS, 30), partition="0")
    append_step(lake_copy, "enrich", {"orders": Range("orders", "0", 35, 45)})
    (v,) = only(audit(lake_copy), "gap")
    assert (v.processor, v.queue, v.partition, v.offsets, v.step) == (
        "enrich",
        "orders",
        "0",
        (30, 35),
        3,
    )


def test_attempt_that_rereads_offsets_is_an_overlap(lake_copy: Lake) -> None:
    lake_copy.queue("orders").append(orders(ORDERS, 30), partition="0")
    append_step(lake_copy, "enrich", {"orders": Range("orders", "0", 26, 37)})
    report = audit(lake_copy)
    (v,) = only(report, "overlap")
    assert (v.processor, v.queue, v.partition, v.offsets, v.step) == (
        "enrich",
        "orders",
        "0",
        (26, 30),
        3,
    )
    assert report.processors["enrich"].inputs[0].delivered_end == 37


def test_alts_snapshot_reading_a_non_chosen_binding(lake_copy: Lake) -> None:
    lake_copy.queue("orders").append(orders(ORDERS, 10), partition="0")
    append_step(
        lake_copy,
        "enrich",
        {"orders": Range("orders", "0", 30, 35), "other": Range("big", "0", 0, 2)},
        alts="orders",
    )
    (v,) = only(audit(lake_copy), "alts_not_empty")
    assert (v.queue, v.partition, v.offsets, v.step) == ("big", "0", (0, 2), 3)


def test_reading_past_the_end_of_the_input(lake_copy: Lake) -> None:
    append_step(lake_copy, "enrich", {"orders": Range("orders", "0", 30, 33)})
    (v,) = only(audit(lake_copy), "beyond_end")
    assert (v.queue, v.partition, v.offsets) == ("orders", "0", (30, 33))


# -- bad input, backing in words ---------------------------------------------------------------------
def test_no_such_lake_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(LakeNotFoundError, match="does not exist") as info:
        audit(Lake(root=str(tmp_path / "nowhere")))
    assert isinstance(info.value, AuditError) and isinstance(info.value, CuesError)
    (tmp_path / "plain").mkdir()
    with pytest.raises(LakeNotFoundError, match="not a cues lake"):
        audit(Lake(root=str(tmp_path / "plain")))


def test_describe_backing_in_words(clean_lake: Path) -> None:
    lake = Lake(root=str(clean_lake))
    first = attempts(lake, "enrich")[0]
    lines = describe_backing(lake, "enrich", last=None)
    assert lines[0].startswith("backing queue of enrich") and "3 step(s)" in lines[0]
    assert lines[1] == (
        f"step 0: snapshot of orders/0 [0, 10) — hash {first.hash[:8]}…; "
        "attempt: output 10 rows to enriched/0 (committed)"
    )
    assert "attempt: error 'ValueError: bad batch' 1 row to errors/0 (committed)" in lines[3]
    assert len(describe_backing(lake, "split", last=2)) == 3
    assert any("attempt: nil" in line for line in describe_backing(lake, "split", last=None))
    with pytest.raises(NoSuchProcessorError, match="enrich, split"):
        describe_backing(lake, "nope")


def test_loader_errors_are_clear(tmp_path: Path) -> None:
    from cues_platform.processing.loader import GraphLoadError

    path = write_graph(tmp_path)
    assert load_graph(str(path)).name == "shop"  # the module's one graph
    with pytest.raises(GraphLoadError, match="has no attribute 'nope'.*graphs it defines: graph"):
        load_graph(f"{path}:nope")
    with pytest.raises(GraphLoadError, match="does not exist"):
        load_graph(f"{tmp_path / 'missing.py'}:graph")
    with pytest.raises(GraphLoadError, match="no module named 'no_such_mod_xyz'"):
        load_graph("no_such_mod_xyz:graph")
    with pytest.raises(
        GraphLoadError, match="is a ModuleType|is a Schema|not a cues_platform Graph"
    ):
        load_graph(f"{path}:ORDERS")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(GraphLoadError, match="RuntimeError: boom"):
        load_graph(f"{broken}:graph")
