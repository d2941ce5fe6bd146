"""Asset checks on processor outputs: the pandera contract and the exactly-once audit, each
failing on a lake doctored the way a bug or a rogue producer would."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetKey, AssetSelection, materialize

from cues_platform.dagster import validate_contract
from cues_platform.dagster.checks import MAX_LISTED, failure_counts
from cues_platform.processing.history import processor_history
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import contract, load_orders


def _checks(defs, instance) -> dict[str, tuple[bool, dict]]:
    """Runs only the checks of ``enriched`` (no materialization) and returns them by name."""
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=AssetSelection.checks_for_assets(AssetKey("enriched")),
                         raise_on_error=False)
    assert not result.get_asset_materialization_events()
    return {e.check_name: (e.passed, {k: v.value for k, v in e.metadata.items()})
            for e in result.get_asset_check_evaluations()}


def test_contract_and_exactly_once_checks_fail_on_a_doctored_queue(defs, lake, instance) -> None:
    load_orders(lake)
    run = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                      selection=[AssetKey("enriched")])
    assert run.success
    checks = _checks(defs, instance)
    assert checks["contract"][0] and checks["exactly_once"][0]
    assert checks["exactly_once"][1]["steps_delivered"] == 3

    # a producer appends a row breaking the contract (id >= 0) directly to the queue
    enriched = lake.queue("enriched")
    enriched.append(pa.table({"id": pa.array([-4], pa.int64()), "note": ["rogue"]}), partition="0")
    checks = _checks(defs, instance)
    passed, meta = checks["contract"]
    assert not passed and meta["failures"] == 1 and meta["failing_rows"] == 1
    assert meta["queue"] == "enriched"
    assert meta["failed_checks"] == ["id: greater_than_or_equal_to(0)"]
    assert "-4" in meta["details"]
    # a producer row (no delivery hash) in an exactly-once output is written outside the protocol
    assert not checks["exactly_once"][0]

    # a bug delivers step 1 of enrich a second time, with the same delivery hash
    step1 = [r for r in processor_history(lake, "enrich") if r.is_attempt][1]
    table = enriched.read_arrow(partition="0")
    mine = table.filter(pc.equal(table["_delivery_hash"], step1.hash))
    assert mine.num_rows == 10
    enriched.append(mine.select(enriched.payload_schema.names), partition="0",
                    delivery_hash=step1.hash)
    passed, meta = _checks(defs, instance)["exactly_once"]
    assert not passed and meta["violations"] == 2  # the rogue producer row is still there too
    assert meta["by_kind"] == {"delivered_twice": 1, "no_delivery_hash": 1} and not meta["lake_ok"]
    assert "delivered_twice" in meta["first_violations"] and step1.hash[:12] in meta["first_violations"]


def test_validate_contract_on_pandas_and_spark(spark) -> None:
    good = pa.table({"id": pa.array([0, 2], pa.int64()), "note": ["a", None]})
    assert validate_contract(contract(), good) == (True, [])
    bad = pa.table({"id": pa.array([1, -1, -3], pa.int64()), "note": ["a", "b", "c"]})
    passed, failures = validate_contract(contract(), bad)
    assert not passed and sorted(f["failure_case"] for f in failures) == ["-1", "-3"]

    import pandera.pyspark as ps
    from pyspark.sql.types import LongType

    spark_contract = ps.DataFrameSchema({"id": ps.Column(LongType(), ps.Check.ge(0))})
    df = spark.createDataFrame(bad.to_pandas())
    passed, failures = validate_contract(spark_contract, df)
    assert not passed
    assert any(f["column"] == "id" and "greater_than_or_equal_to" in f["check"] for f in failures)
    assert validate_contract(spark_contract, spark.createDataFrame(good.to_pandas()))[0]


def test_contract_failures_count_rows_and_checks_not_columns_and_are_not_capped() -> None:
    """A row-level check that pandera reports once per column counts once per row; a whole-frame
    check counts each failing row; counts cover every case, not only the MAX_LISTED listed."""
    import pandera.pandas as pap

    wide = pap.DataFrameSchema(
        {"id": pap.Column("int64"), "amount": pap.Column("int64")},
        checks=[pap.Check(lambda df: df > 0, name="all_positive"),
                pap.Check(lambda df: df["id"] != 5, name="not_five")])
    rows = pa.table({"id": pa.array([1, -1, 5, -2], pa.int64()),
                     "amount": pa.array([1, -3, 2, -4], pa.int64())})
    passed, failures = validate_contract(wide, rows)
    assert not passed
    assert failure_counts(failures) == {"failures": 3, "failing_rows": 3}  # rows 1, 3 and 2

    many = pa.table({"id": pa.array([-i for i in range(1, MAX_LISTED + 6)], pa.int64()),
                     "note": ["x"] * (MAX_LISTED + 5)})
    passed, failures = validate_contract(contract(), many)
    assert failure_counts(failures) == {"failures": MAX_LISTED + 5, "failing_rows": MAX_LISTED + 5}


def test_the_error_queue_check_fails_on_a_row_a_platform_failure_wrote(defs, lake, instance) -> None:
    """User and contract error rows are legitimate; a row whose exception type is Spark's (the
    way older versions filed a dying executor as the user's error) fails ``no_platform_errors``."""
    from datetime import UTC, datetime

    from cues_platform.processing import ERROR_SCHEMA

    load_orders(lake, start=-1, count=11)  # one contract break: a legitimate error row
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                       selection=[AssetKey("enriched")]).success

    def check() -> tuple[bool, dict]:
        result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                             selection=AssetSelection.checks_for_assets(AssetKey("errors")),
                             raise_on_error=False)
        (ev,) = result.get_asset_check_evaluations()
        assert ev.check_name == "no_platform_errors"
        return ev.passed, {k: v.value for k, v in ev.metadata.items()}

    passed, meta = check()
    assert passed and meta["platform_error_rows"] == 0
    row = {"processor": ["enrich"], "step": [7], "inputs": ['{"src": ["orders", "0", 70, 80]}'],
           "exception_type": ["py4j.protocol.Py4JJavaError"], "message": ["executor lost"],
           "traceback": [""], "failed_at": [datetime.now(UTC)], "queue": [None], "payload": [None]}
    lake.queue("errors").append(pa.table(row, schema=ERROR_SCHEMA), partition="0")
    passed, meta = check()
    assert not passed and meta["platform_error_rows"] == 1
    assert meta["by_processor"] == {"enrich": {"py4j.protocol.Py4JJavaError": 1}}
