"""The daily settlement report: each participant's net position per value date.

Daily-partitioned (the partition key is the value date). It reads ``results`` through the
platform's IO manager (the queue, all subjects, as Arrow) and writes through it too: each
materialization REPLACES its day in one Delta commit, so re-running a failed or late day —
``dagster asset materialize -f definitions.py --select settlement_report --partition 2026-11-21`` or
a backfill in the UI — gives the same report, never doubled, and leaves other days untouched.
"""


from datetime import date

import pyarrow as pa
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    DailyPartitionsDefinition,
    Definitions,
    asset,
)

from cues_platform.dagster import IO_MANAGER_KEY
from cues_platform.reference.report import settlement_report as compute_report

DAILY = DailyPartitionsDefinition(start_date="2026-11-16", end_offset=1)


@asset(
    partitions_def=DAILY,
    ins={"results": AssetIn(key=AssetKey(["results"]))},
    io_manager_key=IO_MANAGER_KEY,
    group_name="reports",
    kinds={"python", "delta"},
    metadata={"cues/partition_column": "partition_key"},
)
def settlement_report(context: AssetExecutionContext, results: pa.Table) -> pa.Table:
    """Per participant and value date: postings sent and received (count, EUR) and the net position
    (received - sent) from the OK results; the day's positions sum to zero."""
    day = date.fromisoformat(context.partition_key)
    report = compute_report(results, day)
    context.add_output_metadata({
        "value_date": day.isoformat(),
        "participants": report.num_rows,
        "settled_postings": int(sum(report["sent_count"].to_pylist())),
        "net_positions": {r["participant"]: float(r["net_position"]) for r in report.to_pylist()},
    })
    return report


defs = Definitions(assets=[settlement_report])
