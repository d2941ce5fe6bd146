"""Asset checks on processor outputs: the pandera contract and the exactly-once audit, each
failing on a lake doctored the way a bug or a rogue producer would."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetCheckSeverity, AssetKey, AssetSelection, materialize

from cues_platform.dagster import validate_contract
from cues_platform.dagster.checks import MAX_LISTED, failure_counts
from cues_platform.processing.history import processor_history
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import contract, load_orders
from tests.support import rows


def _checks(defs, instance) -> dict[str, tuple[bool, dict]]:
    """Runs only the checks of ``enriched`` (no materialization) and returns them by name."""
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=AssetSelection.checks_for_assets(AssetKey("enriched")),
                         raise_on_error=False)
    assert not result.get_asset_materialization_events()
    return {e.check_name: (e.passed, {k: v.value for k, v in e.metadata.items()})
            for e in result.get_asset_check_evaluations()}


def _evaluations(result, asset: str = "enriched") -> dict[str, tuple[bool, dict]]:
    return {e.check_name: (e.passed, {k: v.value for k, v in e.metadata.items()})
            for e in result.get_asset_check_evaluations() if e.asset_key == AssetKey(asset)}


def test_the_contract_check_judges_every_arrived_row_and_holds_a_failing_one_open(
        graph, lake_resource, defs, lake, instance) -> None:
    """Red: rows a step delivered break the contract as it is now (here: the contract was added
    after ``enrich`` wrote them). The next materialization splits its own contract breaks off to
    the error queue and its rows pass, but the check judges them *and* the row still open: red,
    downstream skipped (``tests/dagster/test_check_memory.py`` walks the way out)."""
    from cues_platform.dagster import CuesSparkResource, build_definitions
    from tests.dagster.graphs import build_graph

    before_contract = build_definitions(build_graph(with_contract=False), lake=lake_resource,
                                        spark=CuesSparkResource())
    load_orders(lake, start=-1, count=11)  # enrich turns -1 into -2: breaks id >= 0
    assert materialize(assets_of(before_contract), resources=resources_of(before_contract), instance=instance,
                       selection=[AssetKey("enriched")]).success

    checks = _checks(defs, instance)  # the checks as deployed now, with the contract
    passed, meta = checks["contract"]
    assert not passed and meta["judged_ranges"] == {"0": [[0, 11]]} and meta["rows_checked"] == 11
    assert meta["failures"] == 1 and meta["failing_rows"] == 1 and meta["cues/open_failing"] == {"0": [[0, 1]]}
    assert meta["failed_checks"] == ["id: greater_than_or_equal_to(0)"] and "-2" in meta["details"]
    assert checks["exactly_once"][0]

    lake.queue("orders").append(rows(-3, 13), partition="0")  # -3..9: -6, -4 and -2 break it
    run = materialize(assets_of(defs), resources=resources_of(defs), instance=instance, raise_on_error=False)
    assert not run.success
    passed, meta = _evaluations(run)["contract"]
    assert not passed and meta["judged_ranges"] == {"0": [[0, 1], [11, 21]]} and meta["rows_checked"] == 11
    assert meta["cues/open_failing"] == {"0": [[0, 1]]} and meta["cues/judged_to"] == {"0": 21}
    assert not {AssetKey("big"), AssetKey("small")} & {e.asset_key for e in run.get_asset_materialization_events()}
    errors = lake.queue("errors").read_arrow(partition="0")
    assert sorted(errors["queue"].to_pylist()) == ["enriched"] * 3  # the step split its breaks off
    assert all('"id": -' in p for p in errors["payload"].to_pylist())


def test_rows_written_outside_the_protocol_warn_without_blocking_and_stay_until_quarantined(
        defs, lake, instance) -> None:
    """A row appended straight into an exactly-once output (no delivery hash) breaking its
    contract: the blocking checks judge what the protocol delivered and pass, so downstream runs;
    ``outside_protocol`` (WARN) names the row, and keeps naming it at the next materialization
    (it holds the row open, as ``contract`` holds a failing one) until it is quarantined."""
    from cues_platform.dagster.check_quarantine import OUTSIDE_PROTOCOL_EXCEPTION_TYPE, quarantine

    load_orders(lake)
    run = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                      selection=[AssetKey("enriched")])
    checks = _evaluations(run)
    assert all(ok for ok, _ in checks.values()) and {"contract", "exactly_once", "outside_protocol"} <= set(checks)
    assert checks["outside_protocol"][1]["rows"] == 0 and checks["exactly_once"][1]["steps_delivered"] == 3
    assert checks["outside_protocol"][1]["cues/judged_to"] == {"0": 30}

    enriched = lake.queue("enriched")
    enriched.append(pa.table({"id": pa.array([-4], pa.int64()), "note": ["rogue"]}), partition="0")  # offset 30
    load_orders(lake, start=30, count=10)
    run = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert run.success
    checks = _evaluations(run)
    assert checks["contract"][0] and checks["contract"][1]["judged_ranges"] == {"0": [[30, 41]]}
    assert checks["contract"][1]["rows_checked"] == 10 and checks["contract"][1]["rows_outside_protocol"] == 1
    passed, meta = checks["exactly_once"]
    assert passed and meta["violations"] == 0 and not meta["lake_ok"]  # the audit still sees it
    passed, meta = checks["outside_protocol"]
    assert not passed and meta["rows"] == 1 and meta["offsets"] == {"0": [[30, 31]]}
    assert meta["judged_ranges"] == {"0": [[30, 41]]} and meta["cues/open_failing"] == {"0": [[30, 31]]}
    assert meta["rows_breaking_the_contract"] == 1 and "docs/dagster.md" in meta["what_to_do"]
    assert "| 0 | 30 |" in meta["rows_sample"] and "rogue" in meta["rows_sample"]
    (warn,) = [e for e in run.get_asset_check_evaluations() if e.check_name == "outside_protocol"
               and e.asset_key == AssetKey("enriched")]
    assert warn.severity == AssetCheckSeverity.WARN
    assert {e.asset_key for e in run.get_asset_materialization_events()} >= {AssetKey("big"), AssetKey("small")}

    load_orders(lake, start=40, count=10)  # new good rows: the open row is still open
    run = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    passed, meta = _evaluations(run)["outside_protocol"]
    assert not passed and meta["offsets"] == {"0": [[30, 31]]} and meta["rows_in_queue"] == 1
    assert meta["judged_ranges"] == {"0": [[30, 31], [41, 51]]} and meta["memory_from_run"]

    assert quarantine(lake, error_queue="errors", queue="enriched", partition="0", start=30, end=31,
                      reason="a test producer's row") == 1
    errors = lake.queue("errors").read_arrow(partition="0")
    assert errors.filter(pc.equal(errors["exception_type"], OUTSIDE_PROTOCOL_EXCEPTION_TYPE)).num_rows == 1
    passed, meta = _checks(defs, instance)["outside_protocol"]
    assert passed and meta["rows"] == 0 and meta["closed_by_quarantine_rows"] == 1
    assert meta["rows_in_queue"] == 1  # it stays in the queue: the audit still lists it


def test_exactly_once_check_fails_on_a_step_delivered_twice(defs, lake, instance) -> None:
    load_orders(lake)
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                       selection=[AssetKey("enriched")]).success
    enriched = lake.queue("enriched")
    # a bug delivers step 1 of enrich a second time, with the same delivery hash
    step1 = [r for r in processor_history(lake, "enrich") if r.is_attempt][1]
    table = enriched.read_arrow(partition="0")
    mine = table.filter(pc.equal(table["_delivery_hash"], step1.hash))
    assert mine.num_rows == 10
    enriched.append(mine.select(enriched.payload_schema.names), partition="0",
                    delivery_hash=step1.hash)
    passed, meta = _checks(defs, instance)["exactly_once"]
    assert not passed and meta["violations"] == 1
    assert meta["by_kind"] == {"delivered_twice": 1} and not meta["lake_ok"]
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
    check counts each failing row; a row failing two checks is one failing row but two failures
    (per (row, check)); counts cover every case, not only the MAX_LISTED listed."""
    import pandera.pandas as pap

    wide = pap.DataFrameSchema(
        {"id": pap.Column("int64"), "amount": pap.Column("int64")},
        checks=[pap.Check(lambda df: df > 0, name="all_positive"),
                pap.Check(lambda df: df["id"] != 5, name="not_five")])
    # row 0 passes; rows 1 and 3 fail all_positive; row 2 fails all_positive (its amount) AND
    # not_five: one failing row, two (row, check) failures. pandera reports not_five once per column
    rows = pa.table({"id": pa.array([1, -1, 5, -2], pa.int64()),
                     "amount": pa.array([1, -3, -2, -4], pa.int64())})
    passed, failures = validate_contract(wide, rows)
    assert not passed
    assert len(failures) == 5  # cases as pandera reports them: 5 cases, 4 (row, check), 3 rows
    assert {(f["index"], f["check"]) for f in failures} == {
        ("1", "all_positive"), ("2", "all_positive"), ("3", "all_positive"), ("2", "not_five")}
    assert failure_counts(failures) == {"failures": 4, "failing_rows": 3}

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


def test_a_materialization_without_recorded_ranges_is_not_passed_unchecked(defs, lake, instance) -> None:
    """A materialization an older version made (no ``cues/written_ranges``): the contract check
    needs no ranges from it (it judges what arrived since its own last evaluation: the row written
    by hand, counted as outside the protocol); ``outside_protocol`` looks at the whole queue."""
    from dagster import AssetMaterialization

    load_orders(lake)
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                       selection=[AssetKey("enriched")]).success
    lake.queue("enriched").append(pa.table({"id": pa.array([7], pa.int64()), "note": ["by hand"]}), partition="0")
    instance.report_runless_asset_event(AssetMaterialization(asset_key="enriched"))
    checks = _checks(defs, instance)
    passed, meta = checks["contract"]
    assert passed and meta["judged_ranges"] == {"0": [[30, 31]]} and meta["rows_outside_protocol"] == 1
    passed, meta = checks["outside_protocol"]
    assert not passed and meta["offsets"] == {"0": [[30, 31]]} and meta["rows_breaking_the_contract"] == 0


def test_a_pyspark_contract_is_judged_on_spark_by_the_check_not_split_by_the_step(
        lake_resource, lake, instance) -> None:
    """``pandera.pyspark`` names failing checks, not rows: the step delivers every row and the
    blocking ``contract`` check evaluates the contract on the Spark frame of the rows the
    materialization wrote; downstream is skipped. The asset's column schema shows the check."""
    from dataclasses import replace

    import pandera.pyspark as ps
    from pyspark.sql.types import LongType

    from cues_platform.dagster import CuesSparkResource, build_definitions
    from tests.dagster.graphs import build_graph

    base = build_graph(with_contract=False)
    strict = ps.DataFrameSchema({"id": ps.Column(LongType(), ps.Check.le(40))}, name="enriched")
    queues = [replace(q, contract=strict) if q.name == "enriched" else q for q in base.queues.values()]
    graph = type(base).build(name=base.name, queues=queues, processors=list(base.processors.values()),
                             error_queue=base.error_queue)
    defs = build_definitions(graph, lake=lake_resource, spark=CuesSparkResource())
    load_orders(lake)  # enrich writes ids 0, 2, ..., 58: 20..29 break id <= 40
    run = materialize(assets_of(defs), resources=resources_of(defs), instance=instance, raise_on_error=False)
    passed, meta = _evaluations(run)["contract"]
    assert not passed and meta["rows_checked"] == 30 and meta["failed_checks"] == ["id: less_than_or_equal_to(40)"]
    assert lake.queue("enriched").count() == 30 and lake.queue("errors").count() == 0  # no row split off
    assert AssetKey("big") not in {e.asset_key for e in run.get_asset_materialization_events()}  # blocked
    schema = defs.resolve_asset_graph().get(AssetKey("enriched")).metadata["dagster/column_schema"]
    assert {c.name: c.constraints.other for c in schema.columns}["id"] == ["less_than_or_equal_to(40)"]
