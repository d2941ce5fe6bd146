"""The main job end to end at small volume (generate → process → reconcile → audit) on a tmp lake,
the session's Spark and a real PostgreSQL, then the daily settlement report materialized through
Dagster and re-run: the same rows, never doubled, other days untouched."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from rich.console import Console

from cues_platform.audit import audit
from cues_platform.queues import Lake
from cues_platform.reference import model as m
from cues_platform.reference.generator import CONTRACT, TrafficSpec
from cues_platform.reference.job import Summary, reconcile, run_reference
from cues_platform.reference.ledger import LedgerDB, totals
from cues_platform.reference.pipeline import payments_graph
from cues_platform.reference.report import read_results, settlement_report
from tests.support import ROOT

# 420 postings spread over ~23 hours of traffic time from 06:00: two value dates, late postings
# for the first day arriving on the second, and every bad-input kind (checked below).
SPEC = TrafficSpec(messages=420, rate=0.005, seed=7, batch=25, p_late=0.06, p_contract_break=0.01, p_resend=0.2)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory: pytest.TempPathFactory, ledger_dsn: str, spark: Any
             ) -> Iterator[tuple[Summary, Lake, LedgerDB, str]]:
    root = str(tmp_path_factory.mktemp("main-job") / "lake")
    db = LedgerDB(ledger_dsn, schema="test_main_job")
    out = io.StringIO()
    summary = run_reference(lake_root=root, spec=SPEC, console=Console(file=out, width=140), ledger=db)
    yield summary, Lake(root=root), db, out.getvalue()
    db.drop()


def test_main_job_reconciles_exactly(main_job) -> None:
    summary, lake, db, output = main_job
    rec = summary.reconciliation
    assert rec.exact, rec.problems
    assert summary.audit_ok, summary.audit_text
    assert summary.ok
    # every posting landed exactly once: one result, one malformed row or one contract error
    assert rec.postings == summary.traffic.postings == SPEC.messages
    assert rec.results + sum(rec.malformed.values()) + rec.contract_breaks == rec.postings
    assert rec.errors == 0
    # the traffic had every case the pipeline must handle
    counts = summary.traffic.counts
    assert counts["late"] > 0 and summary.traffic.resends > 0 and counts[CONTRACT] > 0
    assert set(rec.rejected) == set(m.REJECT_REASONS), rec.rejected
    assert sum(rec.malformed.values()) > 0
    assert len(summary.traffic.days) == 2
    # the PostgreSQL ledger equals the OK results, and balances still sum to the openings
    t = totals(db)
    assert (t.entries, t.amount) == (rec.ok, rec.ok_amount) and t.balanced
    assert t.deliveries >= 1
    # the summary names messages, OK/REJECTED, errors, ledger totals and the audit verdict
    for words in ("postings (messages)", "results OK", "results REJECTED", "malformed → error queue",
                  "contract breaks", "ledger (PostgreSQL)", "reconciliation", "exact",
                  "audit (exactly-once)", "clean"):
        assert words in output, words


def test_rerunning_the_graph_changes_nothing(main_job, spark: Any) -> None:
    """Processing again (a re-run of the whole job) finds every input delivered: no row moves (the
    only commits are recovery's epoch fences: empty commits on each processor's home queue)."""
    from cues_platform.reference.job import process

    summary, lake, db, _ = main_job
    graph = payments_graph(batch_size=1_000)
    before = {q: lake.queue(q).end_offsets() for q in graph.queues}
    ledger_before = totals(db)
    stats = process(graph, lake, spark=spark, ledger=db)
    assert sum(s.steps - s.recovered for s in stats.values()) == 0  # recovery only
    assert {q: lake.queue(q).end_offsets() for q in graph.queues} == before
    assert totals(db) == ledger_before
    assert reconcile(lake, summary.traffic.expected, ledger=db).exact
    assert audit(lake, graph=graph).ok


# -- the daily settlement report through Dagster ---------------------------------------------------
def _report_rows(lake: Lake, day: str) -> list[dict]:
    t = DeltaTable(f"{lake.root}/assets/settlement_report").to_pyarrow_table()
    t = t.filter(pc.equal(t["partition_key"], day)).drop_columns(["partition_key"])
    return sorted(t.to_pylist(), key=lambda r: r["participant"])


def _materialize(lake: Lake, db: LedgerDB, day: str, instance: Any) -> Any:
    from dagster import AssetKey, materialize

    from assets.settlement import add_report_days
    from assets.settlement import settlement_report as report_asset
    from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
    from resources import LedgerResource

    defs = build_definitions(payments_graph(), lake=LakeResource(root=lake.root), spark=CuesSparkResource(),
                             resources={"ledger": LedgerResource(dsn=db.dsn, ledger_schema=db.schema)})
    add_report_days(instance, lake)  # the report's days are the value dates in results
    return materialize([*defs.assets, report_asset], selection=[AssetKey("settlement_report")],
                       partition_key=day, resources=dict(defs.resources), instance=instance)


def test_settlement_report_partition_rerun_never_doubles(main_job, tmp_path: Path) -> None:
    from dagster import DagsterInstance

    summary, lake, db, _ = main_job
    first, second = (d.isoformat() for d in summary.traffic.days)
    home = tmp_path / "dagster_home"
    home.mkdir()
    with DagsterInstance.local_temp(str(home)) as instance:
        assert _materialize(lake, db, first, instance).success
        once = _report_rows(lake, first)
        assert _materialize(lake, db, second, instance).success
        other = _report_rows(lake, second)
        assert _materialize(lake, db, first, instance).success  # the rerun of a day
        assert _report_rows(lake, first) == once
        assert _report_rows(lake, second) == other
        runs = instance.get_runs()
        assert len(runs) == 3 and all(r.is_success for r in runs)
    # the report is the pure function of the results, and it includes the late postings
    want = settlement_report(read_results(lake), date.fromisoformat(first))
    assert once == sorted(want.to_pylist(), key=lambda r: r["participant"])
    assert sum((r["net_position"] for r in once), Decimal(0)) == 0
    late = summary.traffic.expected.filter(pc.equal(summary.traffic.expected["late"], True))
    late_ok = late.filter(pc.equal(late["outcome"], m.OK)).num_rows
    assert late_ok > 0
    assert sum(r["sent_count"] for r in once) == sum(
        1 for v, s in zip(read_results(lake)["value_date"].to_pylist(),
                          read_results(lake)["status"].to_pylist(), strict=True)
        if v == date.fromisoformat(first) and s == m.OK)
    table = DeltaTable(f"{lake.root}/assets/settlement_report").to_pyarrow_table()
    assert table.num_rows == len(once) + len(other)  # never doubled

    # the README's command: `dagster asset materialize --partition DAY` in its own process
    env = {**os.environ, "CUES_LAKE": lake.root, "DAGSTER_HOME": str(home),
           "CUES_POSTGRES_DSN": db.dsn, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f", "definitions.py",
         "--select", "settlement_report", "--partition", first],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _report_rows(lake, first) == once
    assert DeltaTable(f"{lake.root}/assets/settlement_report").to_pyarrow_table().num_rows == table.num_rows


def test_retention_on_the_reference_lake_keeps_every_reader_working(main_job, spark: Any,
                                                                    tmp_path: Path) -> None:
    """Retention of 0 ms on every queue the processors read (not `results`: the settlement report
    reads it whole, and `accounts`/`malformed`/`errors`, read whole by the job) removes exactly
    what every lane has read; then processing again changes nothing (the ledger neither), the
    audit holds, and a settlement report day re-materialized is the same. Runs last: it moves the
    module lake's start offsets."""
    from dagster import DagsterInstance

    from cues_platform.processing.retention import maintain_queue
    from cues_platform.queues.retention import set_policy
    from cues_platform.reference.job import process

    summary, lake, db, _ = main_job
    graph = payments_graph(batch_size=1_000)
    first = summary.traffic.days[0].isoformat()
    home = tmp_path / "dagster_home"
    home.mkdir()
    with DagsterInstance.local_temp(str(home)) as instance:
        assert _materialize(lake, db, first, instance).success
    report_before = _report_rows(lake, first)
    retained = ["postings", "instructions", "parsed", "fx_rates", "priced", "ledger_entries"]
    ends = {q: lake.queue(q).end_offsets() for q in graph.queues}
    for name in retained:
        set_policy(lake.queue(name), ms=0, bytes=None)
    for name in graph.queues:
        maintain_queue(lake.queue(name), retention_hours=1.0)
    starts = {q: lake.queue(q).start_offsets() for q in graph.queues}
    # every lane had read everything: the retained queues start at their ends, the others at 0
    assert {q: s for q, s in starts.items() if q in retained} == {q: ends[q] for q in retained}
    assert all(set(starts[q].values()) == {0} for q in graph.queues if q not in retained)
    ledger_before = totals(db)
    stats = process(graph, lake, spark=spark, ledger=db)
    assert sum(s.steps - s.recovered for s in stats.values()) == 0
    assert {q: lake.queue(q).end_offsets() for q in graph.queues} == ends
    assert totals(db) == ledger_before  # (reconcile() reads postings whole: not after retention)
    report = audit(lake, graph=graph)
    assert report.ok, report.to_text()
    with DagsterInstance.local_temp(str(home)) as instance:
        assert _materialize(lake, db, first, instance).success
    assert _report_rows(lake, first) == report_before
