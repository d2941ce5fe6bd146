"""The ``cues`` command (click, Dagster's own CLI library): the root group, which assembles the
command groups, one module each in this package."""

from __future__ import annotations

import click

from cues_platform.cli.audit import audit_command
from cues_platform.cli.backing import backing
from cues_platform.cli.common import CuesGroup
from cues_platform.cli.demo import demo
from cues_platform.cli.error_rows import errors_group
from cues_platform.cli.graph import graph_group
from cues_platform.cli.processor import processor
from cues_platform.cli.quarantine import quarantine_group
from cues_platform.cli.queue import queue
from cues_platform.cli.run import run_command
from cues_platform.cli.txn import txn
from cues_platform.jepsen.cli import jepsen
from cues_platform.participants.cli import participant
from cues_platform.spark.cli import spark


@click.group(cls=CuesGroup)
def main() -> None:
    """cues_platform: exactly-once stream processing on Delta Lake queues."""


main.add_command(demo)
main.add_command(queue)
main.add_command(audit_command)
main.add_command(backing)
main.add_command(graph_group)
main.add_command(run_command)
main.add_command(participant)  # cues participant ... (the postings protocol, seed 002)
main.add_command(jepsen)  # cues jepsen
main.add_command(spark)  # cues spark
main.add_command(processor)  # cues processor
main.add_command(txn)  # cues txn
main.add_command(errors_group)  # cues errors (error rows, one per failing input row)
main.add_command(quarantine_group)  # cues quarantine (rows a contract/outside_protocol check holds open)

__all__ = ["main"]
