"""The auditor's new truths: error rows that a platform failure wrote (step 6) and rows written
into an exactly-once output outside the protocol (step 2)."""

from __future__ import annotations

from cues_platform.audit import audit
from cues_platform.processing import Range, RecordType
from cues_platform.processing.outputs import error_table
from cues_platform.queues import Lake
from cues_platform.queues.layout import PROCESSOR_STEP
from tests.audit.lakes import ORDERS, append_step, only, orders


def platform_exception() -> Exception:
    """An exception of the class a Spark job failure raises (py4j.protocol.Py4JJavaError), without
    a JVM: error_table records ``module.QualName`` of its class."""
    cls = type("Py4JJavaError", (Exception,), {"__module__": "py4j.protocol"})
    return cls("An error occurred while calling o123.collectToPython: executor lost")


def test_error_row_of_a_platform_failure_is_a_violation(lake_copy: Lake) -> None:
    # What an older version did on a Spark failure: an attempt_error record, then its error row
    # committed to the error queue with the step's hash and app transaction.
    lake_copy.queue("orders").append(orders(ORDERS, 10), partition="0")
    snapshot = append_step(
        lake_copy,
        "enrich",
        {"orders": Range("orders", "0", 30, 40)},
        kind=RecordType.ATTEMPT_ERROR,
        outputs={"rows": {"errors": {"0": 1}}},
    )
    errors = lake_copy.queue("errors")
    end = errors.next_offset("0")
    errors.append(
        error_table(snapshot, platform_exception()),
        partition="0",
        delivery_hash=snapshot.delivery_hash,
        message_type="error",
        app_transactions=[(PROCESSOR_STEP.id("enrich"), snapshot.step)],
    )
    report = audit(lake_copy)
    (v,) = only(report, "platform_error")
    assert (v.processor, v.step, v.queue, v.partition, v.offsets, v.hash) == (
        "enrich", 3, "errors", "0", (end, end + 1), snapshot.delivery_hash,
    )  # fmt: skip
    assert "py4j.protocol.Py4JJavaError" in v.message and "orders/0 [30, 40)" in v.message
    assert "[platform_error] errors/0" in report.to_text()
    # The user's own ValueError of step 2 (in the clean lake) is not one.
    assert all(v.step != 2 for v in report.violations)


def test_error_row_with_a_platform_type_written_by_hand_is_a_violation(lake_copy: Lake) -> None:
    table = error_table(append_step(lake_copy, "split", {"enriched": Range("enriched", "0", 20, 20)}),
                        ValueError("x"))
    table = table.set_column(
        table.schema.get_field_index("exception_type"), "exception_type",
        [["deltalake.exceptions.CommitFailedError"]],
    )  # fmt: skip
    lake_copy.queue("errors").append(table, partition="0")  # no hash: also outside the protocol
    report = audit(lake_copy)
    assert {v.kind for v in report.violations} == {"platform_error", "no_delivery_hash"}
    (v,) = report.by_kind("platform_error")
    assert (v.processor, v.step) == ("split", 2) and "CommitFailedError" in v.message


def test_producer_rows_in_an_exactly_once_output_are_reported(lake_copy: Lake) -> None:
    small = lake_copy.queue("small")
    end = small.next_offset("0")
    small.producer(producer_id="feeder").send(orders(900, 3), partition="0")
    (v,) = only(audit(lake_copy), "no_delivery_hash")
    assert (v.queue, v.partition, v.offsets, v.processor) == ("small", "0", (end, end + 3), "split")
    assert "outside the step protocol" in v.message
