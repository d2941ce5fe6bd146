"""``cues demo``: the reference payments pipeline end to end on embedded defaults."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cues_platform.cli.common import console
from cues_platform.demo import run_demo
from cues_platform.pgserver_db import embedded_postgres, stop_embedded_postgres
from cues_platform.settings import command_line, current


@click.command()
@click.option(
    "--lake", "lake_root", default=None,
    help="Lake root (recreated). Default: the lake the Dagster UI serves ($CUES_LAKE or ./lake) with "
         "--engine dagster, .cues/demo-lake with --engine runner.")
@click.option("--messages", type=int, default=None,
              help="Postings to generate (default 3,000; with --queues: 100,000 messages).")
@click.option("--seed", default=7, show_default=True, help="Traffic seed (the same seed, the same traffic).")
@click.option("--rate", default=0.03, show_default=True,
              help="Postings per second of traffic time (3,000 at 0.03/s: about 28 hours, two value dates).")
@click.option("--batch-size", default=1_000, show_default=True, help="Processor batch size.")
@click.option("--engine", type=click.Choice(["dagster", "runner"]), default="dagster", show_default=True,
              help="dagster: the deployment's job payments__all as Dagster runs on the project's instance "
                   "($DAGSTER_HOME or ./dagster_home), shown by `dagster dev` afterwards; runner: the graph "
                   "runner alone (faster, records no Dagster run; --batch-size applies to it only).")
@click.option("--keep-postgres", is_flag=True,
              help="Leave the embedded PostgreSQL running afterwards (default: stop it if the demo started it).")
@click.option("--queues", "queues_only", is_flag=True, help="The earlier queue-layer demo instead.")
def demo(lake_root: str | None, messages: int | None, seed: int, rate: float, batch_size: int, engine: str,
         keep_postgres: bool, queues_only: bool) -> None:
    """The main job: the reference payments pipeline end to end on embedded defaults.

    Generates realistic traffic (malformed rows, duplicate ids, contract breaks, late data,
    producer resends), processes it with every processor kind exactly once on Spark, books the
    ledger in PostgreSQL (embedded unless $CUES_POSTGRES_DSN is set), reconciles every posting,
    audits the lake and prints a summary. Exit code 1 if reconciliation or the audit fails.
    """
    if queues_only:
        ok = run_demo(lake_root=lake_root or ".cues/demo-lake", messages=messages or 100_000, console=console)
        sys.exit(0 if ok else 1)
    if engine == "dagster":
        lake_root = lake_root or current().lake
    else:
        lake_root = lake_root or ".cues/demo-lake"
    # the deployment's lake resource reads the setting `lake` when a run opens the lake (in this
    # process): the command-line layer of the settings points it at this lake
    with command_line(lake=lake_root if engine == "dagster" else None):
        _reference(lake_root=lake_root, messages=messages, seed=seed, rate=rate,
                   batch_size=batch_size, engine=engine, keep_postgres=keep_postgres)


def _reference(*, lake_root: str, messages: int | None, seed: int, rate: float, batch_size: int,
               engine: str, keep_postgres: bool) -> None:
    from cues_platform.reference.generator import (
        TrafficSpec,  # lazy: pyspark (450 modules, ~1 s), `cues demo` only
    )
    from cues_platform.reference.job import (  # lazy: pyspark, `cues demo` only
        DEFAULT_PG_DIR,
        run_reference,
    )
    from cues_platform.reference.ledger import (  # lazy: pyspark, psycopg, `cues demo` only
        DEFAULT_SCHEMA,
        LedgerDB,
    )

    external = current().postgres_dsn
    pg_dir = Path(DEFAULT_PG_DIR)
    # the deployment's ledger resource books into DEFAULT_SCHEMA (resources/postgres.py)
    schema = DEFAULT_SCHEMA if engine == "dagster" else "cues_demo"
    started_pg = False
    if external:
        db = LedgerDB(external, schema=schema)  # the DSN may hold a password: never printed
    else:
        import warnings

        with warnings.catch_warnings():  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(pg_dir.resolve()) if pg_dir.exists() else None
        started_pg = info is None or not info.is_running()
        with console.status(f"starting the embedded PostgreSQL ({pg_dir}) ..."):
            db = LedgerDB(embedded_postgres(pg_dir), schema=schema)
    try:
        spec = TrafficSpec(messages=messages or 3_000, seed=seed, rate=rate)
        summary = run_reference(lake_root=lake_root, spec=spec, console=console, ledger=db,
                                batch_size=batch_size, engine=engine)
    finally:
        if started_pg and not keep_postgres:
            stop_embedded_postgres(pg_dir)
    sys.exit(0 if summary.ok else 1)


__all__ = ["demo"]
