"""Partition reruns and backfills of a plain daily asset written by ``CuesIOManager``.

A partitioned write replaces exactly the run's partition(s) in one Delta commit (predicate
overwrite): a failed rerun changes nothing, a rerun gives the same rows (never doubled), other days
are never touched, and a multi-partition (backfill-style) run replaces each of its days.
"""

import pyarrow as pa
import pytest
from dagster import (
    AssetExecutionContext,
    Config,
    DagsterEventType,
    DailyPartitionsDefinition,
    asset,
    materialize,
)
from deltalake import DeltaTable

from cues_platform.dagster import CuesIOManager, CuesSparkResource, InjectedFailure, LakeResource
from cues_platform.dagster.io_manager import PARTITION_COLUMN_METADATA, asset_table_uri
from cues_platform.errors import ConfigurationError

DAYS = DailyPartitionsDefinition(start_date="2024-01-01")
D1, D2, D3 = "2024-03-10", "2024-03-11", "2024-03-12"
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


class DayConfig(Config):
    scale: int = 1
    fail_after_compute: bool = False
    with_column: bool = False  # return the partition_key column (required for several days)
    foreign_day: str | None = None  # return rows labelled with another day (a bug)


@asset(partitions_def=DAYS, io_manager_key="cues_io_manager")
def daily_totals(context: AssetExecutionContext, config: DayConfig) -> pa.Table:
    keys = context.partition_keys
    days = [k for k in keys for _ in range(3)]
    table = pa.table({"n": pa.array([i % 3 for i in range(len(days))], pa.int64()),
                      "value": pa.array([(i % 3 + 1) * config.scale for i in range(len(days))],
                                        pa.int64())})
    if config.with_column or config.foreign_day:
        label = [config.foreign_day] * len(days) if config.foreign_day else days
        table = table.append_column("partition_key", pa.array(label, pa.string()))
    if config.fail_after_compute:
        raise InjectedFailure(f"injected failure after computing {keys}", point="after_compute")
    return table


@asset(partitions_def=DAYS, io_manager_key="cues_io_manager")
def daily_sum(context: AssetExecutionContext, daily_totals: pa.Table) -> pa.Table:
    """Reads its own day of ``daily_totals`` back (the IO manager filters by partition)."""
    days = sorted(set(daily_totals["partition_key"].to_pylist()))
    assert days == list(context.partition_keys), days
    return pa.table({"total": [sum(daily_totals["value"].to_pylist())]})


@asset(partitions_def=DAYS, io_manager_key="cues_io_manager",
       metadata={PARTITION_COLUMN_METADATA: "day"})
def daily_events(context: AssetExecutionContext, config: DayConfig) -> pa.Table:
    """Names each row's day in its own ``date`` column (asset metadata ``cues/partition_column``)."""
    import datetime

    days = [datetime.date.fromisoformat(k) for k in context.partition_keys]
    return pa.table({"day": pa.array(days), "v": pa.array([config.scale] * len(days), pa.int64())})


@pytest.fixture
def resources(lake) -> dict:
    lake_res = LakeResource(root=lake.root)
    return {"lake": lake_res, "spark": CuesSparkResource(),
            "cues_io_manager": CuesIOManager(lake=lake_res, spark=CuesSparkResource())}


def _run(resources, instance, *, key: str | None = None, tags: dict | None = None, **config):
    return materialize([daily_totals], resources=resources, instance=instance, partition_key=key,
                       tags=tags, raise_on_error=False,
                       run_config={"ops": {"daily_totals": {"config": config}}})


def _table(lake) -> DeltaTable:
    return DeltaTable(asset_table_uri(lake, ["daily_totals"]))


def _by_day(lake) -> dict[str, list[tuple[int, int]]]:
    rows = _table(lake).to_pyarrow_table().to_pylist()
    out: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        out.setdefault(r["partition_key"], []).append((r["n"], r["value"]))
    return {k: sorted(v) for k, v in sorted(out.items())}


def _error_classes(result) -> set[str]:
    names: set[str] = set()
    for event in result.all_events:
        if event.event_type != DagsterEventType.STEP_FAILURE:
            continue
        err = event.event_specific_data.error
        while err is not None:
            names.add(err.cls_name)
            names.add(err.message)
            err = err.cause
    return names


def test_rerun_of_a_day_replaces_it_and_nothing_else(lake, instance, resources) -> None:
    assert _run(resources, instance, key=D1).success
    assert _run(resources, instance, key=D2).success
    base = [(0, 1), (1, 2), (2, 3)]
    assert _by_day(lake) == {D1: base, D2: base}
    version = _table(lake).version()
    # a rerun of D1 that fails after computing (before its output is handled) changes nothing
    failed = _run(resources, instance, key=D1, scale=10, fail_after_compute=True)
    assert not failed.success and "InjectedFailure" in _error_classes(failed)
    assert _table(lake).version() == version and _by_day(lake) == {D1: base, D2: base}
    # the rerun replaces D1 (never doubled) and leaves D2 alone
    assert _run(resources, instance, key=D1, scale=10).success
    assert _by_day(lake) == {D1: [(0, 10), (1, 20), (2, 30)], D2: base}
    assert _run(resources, instance, key=D1, scale=10).success  # again: same rows
    assert _by_day(lake) == {D1: [(0, 10), (1, 20), (2, 30)], D2: base}
    downstream = materialize([daily_totals, daily_sum], resources=resources, instance=instance,
                             partition_key=D1, selection=[daily_sum])
    assert downstream.success
    sums = DeltaTable(asset_table_uri(lake, ["daily_sum"])).to_pyarrow_table().to_pylist()
    assert sums == [{"total": 60, "partition_key": D1}]
    last = _table(lake).history(1)[0]
    assert last["dagster.partitions"] == D1 and last["dagster.asset"] == "daily_totals"
    assert _table(lake).metadata().partition_columns == ["partition_key"]


def test_backfill_of_a_range_in_one_run_replaces_each_day(lake, instance, resources) -> None:
    assert _run(resources, instance, key=D2, scale=5).success
    tags = {RANGE_START: D1, RANGE_END: D3}
    # several days in one run need the partition column: without it the write is refused
    refused = _run(resources, instance, tags=tags)
    assert not refused.success and "ConfigurationError" in _error_classes(refused)
    assert any("partition_key" in m for m in _error_classes(refused))
    assert _by_day(lake) == {D2: [(0, 5), (1, 10), (2, 15)]}
    result = _run(resources, instance, tags=tags, with_column=True)
    assert result.success
    base = [(0, 1), (1, 2), (2, 3)]
    assert _by_day(lake) == {D1: base, D2: base, D3: base}
    assert _table(lake).history(1)[0]["dagster.partitions"] == f"{D1},{D2},{D3}"
    mats = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    assert sorted(m.partition for m in mats) == [D1, D2, D3]  # one materialization per day
    meta = mats[0].metadata
    assert meta["replaced_partitions"].value == f"{D1}, {D2}, {D3}" and meta["rows"].value == 9


def test_rows_of_another_day_are_refused_naming_the_column(lake, instance, resources) -> None:
    assert _run(resources, instance, key=D1).success
    before = _by_day(lake)
    bad = _run(resources, instance, key=D2, foreign_day=D1)
    assert not bad.success
    errors = _error_classes(bad)
    assert "ConfigurationError" in errors
    assert any("'partition_key'" in m and D2 in m for m in errors)
    assert _by_day(lake) == before  # D1 untouched, D2 not written


def test_partition_column_normalization() -> None:
    import datetime

    from cues_platform.dagster.io_manager import _with_partition_column

    dates = pa.table({"day": pa.array([datetime.date(2024, 3, 10)] * 2), "v": [1, 2]})
    out = _with_partition_column(dates, "day", [D1])
    assert out["day"].type == pa.string() and out["day"].to_pylist() == [D1, D1]
    added = _with_partition_column(pa.table({"v": [1]}), "partition_key", [D2])
    assert added.column_names == ["v", "partition_key"] and added["partition_key"].to_pylist() == [D2]
    with pytest.raises(ConfigurationError) as info:
        _with_partition_column(dates, "day", [D2, D3])
    assert info.value.column == "day" and not info.value.retryable


def test_partition_column_named_by_asset_metadata(lake, instance, resources) -> None:
    def run(**kwargs):
        return materialize([daily_events], resources=resources, instance=instance,
                           raise_on_error=False, **kwargs)

    assert run(tags={RANGE_START: D1, RANGE_END: D2}).success
    assert run(partition_key=D2, run_config={"ops": {"daily_events": {"config": {"scale": 7}}}}).success
    table = DeltaTable(asset_table_uri(lake, ["daily_events"]))
    assert table.metadata().partition_columns == ["day"]
    assert sorted((r["day"], r["v"]) for r in table.to_pyarrow_table().to_pylist()) == [(D1, 1), (D2, 7)]
