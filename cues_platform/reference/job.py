"""The main job: the reference payments pipeline end to end on embedded defaults.

1. Generate realistic traffic into a fresh lake (:mod:`cues_platform.reference.generator`).
2. Process it: with ``engine="dagster"``, the deployment's job ``payments__all`` as Dagster runs
   on the project's instance (:mod:`cues_platform.reference.deployment`); with ``"runner"``, every
   processor of the payments graph until idle (GraphRunner, upstream first), with live progress.
3. Reconcile: every posting landed exactly where the generator says (one result, or one row in
   the error queue for malformed input), the PostgreSQL ledger equals the OK results.
4. Audit the lake (:func:`cues_platform.audit.audit`) and print a short summary.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.audit import audit
from cues_platform.pgserver_db import dsn_from_env
from cues_platform.processing import Graph, GraphRunner, ProcessorStats
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.queues.location import reset_local_lake
from cues_platform.reference import model as m
from cues_platform.reference.deployment import run_main_job
from cues_platform.reference.generator import (
    CONTRACT,
    CONTRACT_REASON,
    Traffic,
    TrafficSpec,
    generate,
)
from cues_platform.reference.ledger import LedgerDB, LedgerTotals, totals
from cues_platform.reference.pipeline import payments_graph
from cues_platform.reference.report import read_results, settlement_report
from cues_platform.spark import get_spark

DEFAULT_PG_DIR = ".cues/postgres"


# -- reconciliation ---------------------------------------------------------------------------------
@dataclass
class Reconciliation:
    """Where every posting landed compared with what the generator expects."""

    postings: int = 0
    results: int = 0
    ok: int = 0
    rejected: Counter = field(default_factory=Counter)
    malformed: Counter = field(default_factory=Counter)
    contract_breaks: int = 0  # rows of the errors queue that broke the contract of ``instructions``
    errors: int = 0  # other rows in the processors' error queue (a whole failed batch each)
    ok_amount: Decimal = Decimal(0)
    ledger_entries: int = 0
    ledger_amount: Decimal = Decimal(0)
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


CONTRACT_VIOLATION = "cues_platform.ContractViolation"


def contract_breaks(lake: Lake) -> tuple[list[tuple[str, int]], int]:
    """Postings (subject, offset) that broke the contract of ``instructions`` (rows of ``errors``),
    and the number of other error rows (input rows a processor function failed on: isolation
    gives each its own row; `cues errors replay` feeds them back after a fix)."""
    import json

    errors = lake.queue("errors").read_arrow(partition="0", columns=["exception_type", "queue", "payload"])
    broke, other = [], 0
    for kind, queue, payload in zip(errors["exception_type"].to_pylist(), errors["queue"].to_pylist(),
                                    errors["payload"].to_pylist(), strict=True):
        if kind == CONTRACT_VIOLATION and queue == "instructions" and payload:
            row = json.loads(payload)
            broke.append((row["posting_partition"], int(row["posting_offset"])))
        else:
            other += 1
    return broke, other


def _landed(lake: Lake) -> tuple[pa.Table, pa.Table]:
    results = read_results(lake, columns=["posting_partition", "posting_offset", "sender", "message_id",
                                          "status", "reason", "currency", "amount", "settlement_amount",
                                          "value_date"])
    malformed = lake.queue("malformed").read_arrow(partition="0", columns=["posting_partition", "posting_offset",
                                                                            "reason"])
    return results, malformed


def reconcile(lake: Lake, expected: pa.Table | None = None, *, ledger: LedgerDB | None = None) -> Reconciliation:
    """Count outcomes; with ``expected`` (the generator's) check each posting's landing exactly;
    with ``ledger`` check PostgreSQL against the OK results and the ``ledger_entries`` queue."""
    rec = Reconciliation()
    results, malformed = _landed(lake)
    rec.postings = lake.queue("postings").count()
    rec.results = results.num_rows
    statuses = results["status"].to_pylist()
    rec.ok = statuses.count(m.OK)
    rec.rejected = Counter(r for s, r in zip(statuses, results["reason"].to_pylist(), strict=True) if s == m.REJECTED)
    rec.malformed = Counter(r.split(":")[0] for r in malformed["reason"].to_pylist())
    broke, rec.errors = contract_breaks(lake)
    rec.contract_breaks = len(broke)
    ok_rows = results.filter(pc.equal(results["status"], m.OK))
    rec.ok_amount = sum(ok_rows["settlement_amount"].to_pylist(), Decimal(0))
    entries = lake.queue("ledger_entries").read_arrow(partition="0", columns=["amount"])
    rec.ledger_entries, rec.ledger_amount = entries.num_rows, sum(entries["amount"].to_pylist(), Decimal(0))
    if rec.errors:
        rec.problems.append(f"{rec.errors} processor error(s) in the errors queue")
    landed: dict[tuple[str, int], list[tuple[str, str | None]]] = {}
    for p, o, s, r in zip(results["posting_partition"].to_pylist(), results["posting_offset"].to_pylist(),
                          statuses, results["reason"].to_pylist(), strict=True):
        landed.setdefault((p, o), []).append((s, r))
    for p, o, r in zip(malformed["posting_partition"].to_pylist(), malformed["posting_offset"].to_pylist(),
                       malformed["reason"].to_pylist(), strict=True):
        landed.setdefault((p, o), []).append(("MALFORMED", r))
    for key in broke:
        landed.setdefault(key, []).append((CONTRACT, CONTRACT_REASON))
    twice = [k for k, v in landed.items() if len(v) > 1]
    if twice:
        rec.problems.append(f"{len(twice)} posting(s) landed more than once, e.g. {twice[:3]}")
    if rec.ok != rec.ledger_entries or rec.ok_amount != rec.ledger_amount:
        rec.problems.append(f"ledger_entries ({rec.ledger_entries}, {rec.ledger_amount}) differ from the OK "
                            f"results ({rec.ok}, {rec.ok_amount})")
    if expected is not None:
        want = {(p, o): (s, r) for p, o, s, r in zip(
            expected["posting_partition"].to_pylist(), expected["posting_offset"].to_pylist(),
            expected["outcome"].to_pylist(), expected["reason"].to_pylist(), strict=True)}
        lost = [k for k in want if k not in landed]
        extra = [k for k in landed if k not in want]
        wrong = [(k, want[k], landed[k][0]) for k in want if k in landed and landed[k][0] != want[k]]
        if lost:
            rec.problems.append(f"{len(lost)} posting(s) never landed, e.g. {lost[:3]}")
        if extra:
            rec.problems.append(f"{len(extra)} unexpected landing(s), e.g. {extra[:3]}")
        if wrong:
            rec.problems.append(f"{len(wrong)} posting(s) landed with another outcome, e.g. {wrong[:3]}")
        eur = expected.filter(pc.is_valid(expected["amount_eur"]))
        booked = {(p, o): a for p, o, a, c, s in zip(
            results["posting_partition"].to_pylist(), results["posting_offset"].to_pylist(),
            results["settlement_amount"].to_pylist(), results["currency"].to_pylist(), statuses, strict=True)
            if s == m.OK and c == "EUR"}
        off = [(p, o) for p, o, a in zip(eur["posting_partition"].to_pylist(), eur["posting_offset"].to_pylist(),
                                         eur["amount_eur"].to_pylist(), strict=True) if booked.get((p, o)) != a]
        if off:
            rec.problems.append(f"{len(off)} EUR posting(s) settled at another amount, e.g. {off[:3]}")
    if ledger is not None:
        t = totals(ledger)
        if t.entries != rec.ok or t.amount != rec.ok_amount:
            rec.problems.append(f"PostgreSQL ledger ({t.entries} entries, {t.amount}) differs from the OK results "
                                f"({rec.ok}, {rec.ok_amount})")
        if not t.balanced:
            rec.problems.append(f"PostgreSQL balances sum to {t.balance}, openings to {t.opening}")
    return rec


# -- running ----------------------------------------------------------------------------------------
def process(graph: Graph, lake: Lake, *, spark: Any, ledger: LedgerDB, hook: Any = None,
            console: Any = None) -> dict[str, ProcessorStats]:
    """Recovery, then steps of every processor (upstream first) until none has work."""
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, resources={"ledger": ledger}, hook=hook,
                         keep_results=False)
    if console is None:
        return runner.run_until_idle()
    from rich.live import Live

    with Live(_table(runner), console=console, refresh_per_second=4, transient=False) as live:
        runner.recover()
        progressed = True
        while progressed:
            progressed = False
            for pid in runner.steppers:
                if runner.step_once(pid) is not None:
                    progressed = True
                    live.update(_table(runner))
    console.print()
    return runner.stats


def _table(runner: GraphRunner) -> Any:
    from rich.table import Table

    table = Table("processor", "kind", "steps", "rows in", "rows out", "errors", "recovered",
                  title="processing (exactly-once)", title_justify="left")
    for pid, s in runner.stats.items():
        p = runner.graph.processors[pid]
        table.add_row(pid, p.kind.value, str(s.steps), f"{s.rows_in:,}", f"{s.rows_out:,}", str(s.errors),
                      str(s.recovered))
    return table


@dataclass
class Summary:
    traffic: Traffic
    reconciliation: Reconciliation
    ledger: LedgerTotals
    reports: dict[date, pa.Table]
    audit_ok: bool
    audit_text: str
    elapsed: float
    timings: dict[str, float]

    @property
    def ok(self) -> bool:
        return self.audit_ok and self.reconciliation.exact


def run_reference(*, lake_root: str, spec: TrafficSpec, console: Any, ledger: LedgerDB | None = None,
                  batch_size: int = 1_000, engine: str = "runner", fresh: bool = True) -> Summary:
    """Generate → process → reconcile → audit, printing progress and a summary on ``console``."""
    from rich.progress import Progress

    started = time.monotonic()
    timings: dict[str, float] = {}
    console.print(f"[bold]cues_platform reference pipeline: payments postings[/] — lake at {lake_root}")
    if fresh:
        reset_local_lake(lake_root)
    lake = Lake(root=lake_root)
    graph = payments_graph(batch_size=batch_size)
    if ledger is None:
        with console.status("starting PostgreSQL (embedded unless CUES_POSTGRES_DSN is set) ..."):
            ledger = LedgerDB(dsn_from_env(Path(DEFAULT_PG_DIR)), schema="cues_demo")
    if fresh:
        ledger.drop()
    create_queues(graph, lake)

    t = time.monotonic()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("participants posting", total=spec.messages)
        traffic = generate(lake, spec, progress=lambda done, total: bar.update(task, completed=done))
    timings["generate"] = time.monotonic() - t
    c = traffic.counts
    console.print(
        f"generated {traffic.postings:,} postings from {len(spec.participants)} participants in "
        f"{traffic.sends} sends ({traffic.resends} re-sent after a lost ack, absorbed), "
        f"{c['late']} late, {sum(v for k, v in c.items() if k.startswith('MALFORMED'))} malformed, "
        f"{c[f'{m.REJECTED}:{m.DUPLICATE_MESSAGE_ID}']} duplicate ids, {c[CONTRACT]} contract breaks; value dates "
        f"{', '.join(d.isoformat() for d in traffic.days)}")

    t = time.monotonic()
    with console.status("starting Spark ..."):
        spark = get_spark()
    timings["spark start"] = time.monotonic() - t
    t = time.monotonic()
    if engine == "dagster":
        run_main_job(project=Path.cwd(), lake=lake, graph=graph, days=traffic.days, console=console)
    else:
        process(graph, lake, spark=spark, ledger=ledger, console=console)
    timings["process"] = time.monotonic() - t

    t = time.monotonic()
    rec = reconcile(lake, traffic.expected, ledger=ledger)
    ledger_totals = totals(ledger)
    results = read_results(lake)
    reports = {d: settlement_report(results, d) for d in traffic.days}
    report = audit(lake, graph=graph)
    timings["reconcile + audit"] = time.monotonic() - t
    summary = Summary(traffic, rec, ledger_totals, reports, report.ok,
                      report.to_text(max_per_kind=5), time.monotonic() - started, timings)
    print_summary(summary, console)
    return summary


def print_summary(s: Summary, console: Any) -> None:
    from rich.table import Table

    rec, t = s.reconciliation, s.ledger
    table = Table("", "count", "", title="summary", title_justify="left", show_header=False)
    table.add_row("postings (messages)", f"{s.traffic.postings:,}",
                  f"{s.traffic.resends} producer resends absorbed, {s.traffic.counts['late']} late")
    table.add_row("results OK", f"{rec.ok:,}", f"{rec.ok_amount:,.2f} EUR")
    table.add_row("results REJECTED", f"{sum(rec.rejected.values()):,}",
                  ", ".join(f"{k} {v}" for k, v in sorted(rec.rejected.items())))
    table.add_row("malformed → error queue", f"{sum(rec.malformed.values()):,}",
                  ", ".join(f"{k} {v}" for k, v in sorted(rec.malformed.items())))
    table.add_row("contract breaks → errors queue", f"{rec.contract_breaks:,}",
                  "header breaks the contract of instructions")
    table.add_row("processor errors (failing rows)", str(rec.errors), "cues errors replay" if rec.errors else "")
    table.add_row("ledger (PostgreSQL)", f"{t.entries:,} entries",
                  f"{t.amount:,.2f} EUR in {t.deliveries} deliveries; balances "
                  f"{'sum to the openings' if t.balanced else '[red]DO NOT sum to the openings[/]'}")
    table.add_row("reconciliation", "[green]exact[/]" if rec.exact else "[red]MISMATCH[/]",
                  "every posting landed once where expected; ledger = OK results" if rec.exact
                  else "; ".join(rec.problems))
    table.add_row("audit (exactly-once)", "[green]clean[/]" if s.audit_ok else "[red]VIOLATIONS[/]", "")
    console.print(table)
    for day, report in s.reports.items():
        nets = ", ".join(f"{r['participant']} {r['net_position']:+,.2f}" for r in report.to_pylist())
        console.print(f"settlement {day.isoformat()}: {nets}")
    if not s.audit_ok:
        console.print(s.audit_text)
    verdict = "[bold green]OK[/]" if s.ok else "[bold red]FAILED[/]"
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in s.timings.items())
    console.print(f"{verdict}: {s.elapsed:.1f}s ({steps})")
