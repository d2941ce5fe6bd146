"""The auditor's checks 1-4 against real lakes: a clean run of a map + fork graph on Spark, then
the same lake corrupted the way a bug would (duplicate delivery, foreign hash, skipped or re-read
offsets)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from cues_platform.audit import (
    AuditError,
    LakeNotFoundError,
    NoSuchProcessorError,
    audit,
    describe_backing,
)
from cues_platform.errors import CuesError
from cues_platform.processing import Range, RecordType
from cues_platform.processing.backing import Snapshot
from cues_platform.processing.loader import load_graph
from cues_platform.queues import Lake
from tests.audit.lakes import ORDERS, append_step, attempts, only, orders, write_graph


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
    inputs = {"orders": Range("orders", "0", 30, 40)}
    step3 = Snapshot("enrich", 3, inputs).delivery_hash[:8]
    gone = lake_copy.system_uri("staging", "enrich", f"{3:012d}-{step3}", "enriched--0--gone.parquet")
    outputs = {"files": {"enriched": {"0": gone}}, "rows": {"enriched": {"0": 10}}}
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
    big.append(orders(2000, 2), partition="0")  # a row without a hash: outside the protocol
    report = audit(lake_copy)
    assert {v.kind for v in report.violations} == {"unknown_hash", "no_delivery_hash"}
    (v,) = report.by_kind("unknown_hash")
    assert (v.queue, v.partition, v.offsets, v.hash) == ("big", "0", (end, end + 3), made_up)
    (plain,) = report.by_kind("no_delivery_hash")
    assert (plain.queue, plain.partition, plain.offsets) == ("big", "0", (end + 3, end + 5))


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
    assert "1 record(s), 2 one-commit step(s)" in lines[0]  # step 2 (error) has an attempt
    assert lines[1] == (
        f"step 0: reads orders/0 [0, 10) — hash {first.hash[:8]}…; "
        f"one commit (version {first.version}): output 10 rows to enriched/0 (committed)"
    )
    assert "attempt: error 'ValueError: bad batch' 1 row to errors/0 (committed)" in lines[3]
    assert len(describe_backing(lake, "split", last=2)) == 3
    assert any(": nil (no output)" in line for line in describe_backing(lake, "split", last=None))
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
