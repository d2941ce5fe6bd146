"""``cues jepsen`` (and ``python -m cues_platform.jepsen``): run the harness once."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import click

from cues_platform.audit.exit import exit_with
from cues_platform.jepsen.run import HarnessConfig, run_harness


@click.command("jepsen")
@click.option("--seed", type=int, default=None,
              help="Replay this seed (default: a random one, printed first).")
@click.option("--duration", type=float, default=90.0, show_default=True,
              help="Seconds of faults (then heal, drain and check).")
@click.option("--keys", type=int, default=2_000, show_default=True, help="Keys the feeders send.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the lake, logs and report.json (recreated; default: a new temp folder).")
@click.option("--lost-ack-rate", type=float, default=0.05, show_default=True,
              help="Share of idempotent batches whose acknowledgement is lost.")
@click.option("--no-concurrent", is_flag=True, help="Never run two runners at once.")
@click.option("--no-maintenance", is_flag=True, help="No compaction/vacuum racing.")
@click.option("--min-kills", type=int, default=3, show_default=True,
              help="Go on with the faults past --duration until this many kills (at most 180 s more).")
@click.option("--resend-in-txn", is_flag=True,
              help="Also resend batches inside transactions (a lost ack within a transaction).")
@click.option("--redeploy", is_flag=True,
              help="Also redeploy the graph between runner restarts among compatible versions (which "
                   "must continue exactly once) and incompatible ones (which must be refused).")
@click.option("--min-redeploys", type=int, default=0, show_default=True,
              help="With --redeploy: go on past --duration until this many compatible redeploys and "
                   "incompatible attempts (at most 180 s more).")
@click.option("--time", "time_", is_flag=True,
              help="The time nemesis: the platform clock runs a year in --duration seconds while "
                   "retention, a monthly lane, lagging and expendable tailers, short-lived producers, "
                   "dead transactions and maintenance at default settings run (docs/jepsen.md).")
def jepsen(seed: int | None, duration: float, keys: int, workdir: Path | None, lost_ack_rate: float,
           no_concurrent: bool, no_maintenance: bool, min_kills: int, resend_in_txn: bool,
           redeploy: bool, min_redeploys: int, time_: bool) -> None:
    """Jepsen-style harness: `cues run` of a 5-processor graph (two partitions per queue, two lanes
    per processor) under SIGKILL/SIGTERM, killed
    feeders, lost acks, concurrent runners and racing maintenance; an independent checker reads the
    Delta tables. Exit 0 when every check passes, 1 otherwise."""
    seed = random.randrange(1 << 31) if seed is None else seed
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"cues-jepsen-{seed}-"))
    config = HarnessConfig(seed=seed, workdir=workdir, duration=duration, keys=keys,
                           lost_ack_rate=lost_ack_rate, concurrent=not no_concurrent,
                           maintenance=not no_maintenance, resend_in_txn=resend_in_txn,
                           min_kills=min_kills, redeploy=redeploy, min_redeploys=min_redeploys,
                           time=time_)
    result = run_harness(config, echo=lambda line: click.echo(line))
    # The verdict is printed and report.json written; the hard exit skips the interpreter's
    # finalization, where Arrow I/O threads of delta-rs scans (the checker's, the maintenance
    # thread's) asking for the GIL abort the process with exit 134 (cues_platform/audit/exit.py).
    exit_with(0 if result.ok else 1)
