"""The settlement report of the reference deployment (assets/settlement.py; issue 25, item 6): its
partitions are the value dates found in ``results`` (no day without traffic), a backfill of
several days is one run replacing each day once, the automation runs new days and re-runs the
days after ``results`` is updated, and it has a freshness policy.

Real Dagster (``materialize``, an ephemeral instance, the automation evaluator) and a real
``results`` queue in a temporary lake; no Spark (the report reads ``results`` as Arrow).
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    BackfillPolicy,
    DagsterInstance,
    Definitions,
    FreshnessPolicy,
    SensorResult,
    SkipReason,
    build_sensor_context,
    evaluate_automation_conditions,
    materialize,
)
from deltalake import DeltaTable

from assets.settlement import (
    DAYS,
    add_report_days,
    settlement_days,
    settlement_report,
    value_dates,
)
from cues_platform.dagster import CuesIOManager, CuesSparkResource, LakeResource
from cues_platform.dagster.io_manager import asset_table_uri
from cues_platform.queues import Lake
from cues_platform.reference import model as m
from cues_platform.reference.report import settlement_report as compute_report

D1, D2, D3 = date(2026, 11, 20), date(2026, 11, 21), date(2026, 11, 23)
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
RESULTS = AssetSpec(AssetKey("results")).with_io_manager_key("cues_io_manager")


def _results(rows: list[tuple[str, str, str, date]]) -> dict[str, pa.Table]:
    """RESULTS rows (message id, sender, receiver, value date), 10.00 EUR each, OK; by partition
    (the sender)."""
    at = pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py()
    by_sender: dict[str, list[dict]] = {}
    for n, (mid, sender, receiver, day) in enumerate(rows):
        by_sender.setdefault(sender, []).append({
            "message_id": mid, "sender": sender, "receiver": receiver, "status": m.OK, "reason": None,
            "debtor_account": f"{sender}-1", "creditor_account": f"{receiver}-1",
            "amount": Decimal("10.00"), "currency": "EUR", "rate": 1.0,
            "settlement_amount": Decimal("10.00"), "value_date": day, "replays": 0,
            "inception_datum": at, "last_datum": at, "fixing": 1,
            "posting_partition": receiver, "posting_offset": n})
    return {s: pa.Table.from_pylist(r, schema=m.RESULTS) for s, r in by_sender.items()}


def _post(lake: Lake, rows: list[tuple[str, str, str, date]]) -> None:
    if not lake.has_queue("results"):
        lake.create_queue("results", schema=m.RESULTS, partitions=m.PARTICIPANTS)
    lake.queue("results").append_many(_results(rows))


P1, P2, P3 = m.PARTICIPANTS[:3]
FIRST = [("a", P1, P2, D1), ("b", P2, P1, D1), ("c", P1, P3, D2)]


@pytest.fixture
def resources(lake: Lake) -> dict:
    lake_res = LakeResource(root=lake.root)
    return {"lake": lake_res, "spark": CuesSparkResource(),
            "cues_io_manager": CuesIOManager(lake=lake_res, spark=CuesSparkResource())}


@pytest.fixture
def eph() -> DagsterInstance:
    return DagsterInstance.ephemeral()


def _tick(instance: DagsterInstance, resources: dict, cursor: str | None = None):
    with build_sensor_context(instance=instance, cursor=cursor,
                              resources={"lake": resources["lake"]}) as ctx:
        return settlement_days(ctx)


def _added(result) -> list[str]:
    assert isinstance(result, SensorResult), result
    return [k for req in result.dynamic_partitions_requests for k in req.partition_keys]


def _report(lake: Lake) -> DeltaTable:
    return DeltaTable(asset_table_uri(lake, ["settlement_report"]))


def _rows_by_day(lake: Lake) -> dict[str, list[dict]]:
    table = _report(lake).to_pyarrow_table()
    out: dict[str, list[dict]] = {}
    for row in sorted(table.to_pylist(), key=lambda r: (r["partition_key"], r["participant"])):
        out.setdefault(row.pop("partition_key"), []).append(row)
    return out


def test_partitions_are_the_value_dates_in_results(lake, eph, resources) -> None:
    """No queue: the sensor skips. Results of two days: it adds exactly those two (not the days in
    between or around them); unchanged queue: nothing read, nothing added; a third day: only it."""
    assert isinstance(_tick(eph, resources), SkipReason)
    _post(lake, FIRST)
    assert value_dates(lake) == [D1.isoformat(), D2.isoformat()]
    first = _tick(eph, resources)
    assert _added(first) == [D1.isoformat(), D2.isoformat()]
    eph.add_dynamic_partitions(DAYS.name, _added(first))  # what the daemon does with the request
    again = _tick(eph, resources, cursor=first.cursor)
    assert isinstance(again, SkipReason) and "unchanged" in again.skip_message
    _post(lake, [("d", P3, P1, D3), ("e", P2, P3, D1)])
    third = _tick(eph, resources, cursor=first.cursor)
    assert _added(third) == [D3.isoformat()] and third.cursor != first.cursor
    # without the daemon (cues demo): the same days, added once
    assert add_report_days(eph, lake) == [D3.isoformat()]
    assert add_report_days(eph, lake) == []
    assert eph.get_dynamic_partitions(DAYS.name) == [D1.isoformat(), D2.isoformat(), D3.isoformat()]


def test_a_backfill_of_several_days_is_one_run_replacing_each_day(lake, eph, resources) -> None:
    assert settlement_report.backfill_policy == BackfillPolicy.single_run()
    _post(lake, FIRST)
    add_report_days(eph, lake)
    tags = {RANGE_START: D1.isoformat(), RANGE_END: D2.isoformat()}
    result = materialize([RESULTS, settlement_report], selection=[settlement_report], resources=resources,
                         instance=eph, tags=tags)
    assert result.success
    mats = [e.materialization for e in result.get_asset_materialization_events()]
    assert sorted(mat.partition for mat in mats) == [D1.isoformat(), D2.isoformat()]
    assert len(eph.get_runs()) == 1
    history = _report(lake).history()
    assert [h["operation"] for h in history].count("WRITE") == 1  # one commit for both days
    results = pa.concat_tables(_results(FIRST).values())
    want = {d.isoformat(): sorted(compute_report(results, d).to_pylist(), key=lambda r: r["participant"])
            for d in (D1, D2)}
    assert _rows_by_day(lake) == want
    meta = mats[0].metadata
    assert meta["settled_postings"].value == {D1.isoformat(): 2, D2.isoformat(): 1}
    # late postings for D1 arrive; a rerun of D1 alone replaces D1 and leaves D2 as it was
    _post(lake, [("f", P3, P2, D1)])
    again = materialize([RESULTS, settlement_report], selection=[settlement_report], resources=resources,
                        instance=eph, partition_key=D1.isoformat())
    assert again.success
    rows = _rows_by_day(lake)
    assert rows[D2.isoformat()] == want[D2.isoformat()]
    assert sum(r["sent_count"] for r in rows[D1.isoformat()]) == 3
    assert sum((r["net_position"] for r in rows[D1.isoformat()]), Decimal(0)) == 0
    table = _report(lake).to_pyarrow_table()
    assert table.filter(pc.equal(table["partition_key"], D1.isoformat())).num_rows == len(rows[D1.isoformat()])


def test_automation_runs_new_days_and_reruns_them_after_new_results(lake, eph, resources) -> None:
    """``AutomationCondition.eager()``: the days added from the data are requested; once
    materialized, nothing is requested; after ``results`` is updated, the days are requested
    again; a newly added day is requested."""
    report = AssetKey("settlement_report")
    assets = Definitions(assets=[RESULTS, settlement_report], resources=resources)
    _post(lake, FIRST)
    eph.report_runless_asset_event(AssetMaterialization("results"))
    start = evaluate_automation_conditions(defs=assets, instance=eph)  # the daemon's first tick
    assert start.total_requested == 0  # no day yet
    add_report_days(eph, lake)
    first = evaluate_automation_conditions(defs=assets, instance=eph, cursor=start.cursor)
    assert first.get_requested_partitions(report) == {D1.isoformat(), D2.isoformat()}
    assert materialize([RESULTS, settlement_report], selection=[settlement_report], resources=resources,
                       instance=eph, tags={RANGE_START: D1.isoformat(), RANGE_END: D2.isoformat()}).success
    idle = evaluate_automation_conditions(defs=assets, instance=eph, cursor=first.cursor)
    assert idle.total_requested == 0
    _post(lake, [("d", P3, P1, D3)])
    eph.report_runless_asset_event(AssetMaterialization("results"))
    add_report_days(eph, lake)
    after = evaluate_automation_conditions(defs=assets, instance=eph, cursor=idle.cursor)
    assert after.get_requested_partitions(report) == {D1.isoformat(), D2.isoformat(), D3.isoformat()}


def test_the_report_has_a_freshness_policy_and_an_automation_condition() -> None:
    policy = settlement_report.specs_by_key[AssetKey("settlement_report")].freshness_policy
    assert policy == FreshnessPolicy.time_window(fail_window=timedelta(hours=24),
                                                 warn_window=timedelta(hours=12))
    condition = settlement_report.automation_conditions_by_key[AssetKey("settlement_report")]
    assert condition is not None and "eager" in condition.get_label().lower()


def test_the_automation_sensor_is_on_by_default(resources) -> None:
    """One automation-condition sensor targets the report, RUNNING by default (Dagster's own
    default sensor starts stopped); the day sensor is RUNNING too."""
    from dagster import DefaultSensorStatus

    from assets.settlement import defs

    sensors = {s.name: s for s in defs.sensors or []}
    assert set(sensors) == {"settlement_days", "settlement_report_automation"}
    assert all(s.default_status is DefaultSensorStatus.RUNNING for s in sensors.values())
    repo = Definitions.merge(defs, Definitions(assets=[RESULTS], resources=resources)).get_repository_def()
    assert "default_automation_condition_sensor" not in {s.name for s in repo.sensor_defs}


CLI_DEFS = '''
from dagster import AssetKey, AssetSpec, Definitions
from assets.settlement import settlement_report
from cues_platform.dagster import CuesIOManager, CuesSparkResource, LakeResource
lake = LakeResource(root={root!r})
defs = Definitions(
    assets=[AssetSpec(AssetKey("results")).with_io_manager_key("cues_io_manager"), settlement_report],
    resources={{"lake": lake, "cues_io_manager": CuesIOManager(lake=lake, spark=CuesSparkResource())}})
'''


def test_the_readme_command_materializes_a_day_once_it_exists(lake, tmp_path, monkeypatch) -> None:
    """``dagster asset materialize --select settlement_report --partition DAY`` in its own
    process: refused, naming the day, before the day is in ``results``'s dates; once added, it
    writes that day."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.support import ROOT

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster_home" / "dagster.yaml").read_text())
    defs_file = tmp_path / "report_defs.py"
    defs_file.write_text(CLI_DEFS.format(root=lake.root))
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}

    def run(day: date) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f", str(defs_file),
             "--select", "settlement_report", "--partition", day.isoformat()],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    _post(lake, FIRST)
    refused = run(D1)
    assert refused.returncode != 0 and D1.isoformat() in refused.stdout + refused.stderr
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # the instance's dagster.yaml reads it
    with DagsterInstance.from_config(str(home)) as instance:
        assert add_report_days(instance, lake) == [D1.isoformat(), D2.isoformat()]
    done = run(D1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(_rows_by_day(lake)) == [D1.isoformat()]
