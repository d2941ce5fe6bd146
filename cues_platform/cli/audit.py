"""``cues audit``: check exactly-once delivery of every processor of a lake."""

from __future__ import annotations

import click

from cues_platform.audit import audit
from cues_platform.audit.exit import exit_with
from cues_platform.cli.common import lake_option
from cues_platform.processing.loader import load_graph
from cues_platform.queues import Lake


@click.command("audit")
@lake_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--graph",
    "graph_ref",
    default=None,
    metavar="GRAPH",
    help="Optional graph (module:attr or file.py:attr) for topology cross-checks.",
)
def audit_command(lake_root: str, as_json: bool, graph_ref: str | None) -> None:
    """Check exactly-once delivery of every processor; exit 0 when clean, 1 on any violation."""
    graph = None if graph_ref is None else load_graph(graph_ref)
    report = audit(Lake(root=lake_root), graph=graph)
    click.echo(report.to_json() if as_json else report.to_text(max_per_kind=None))
    exit_with(0 if report.ok else 1)  # os._exit after a flush: no teardown crash (audit/exit.py)


__all__ = ["audit_command"]
