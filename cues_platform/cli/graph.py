"""``cues graph …``: inspect graphs."""

from __future__ import annotations

import click

from cues_platform.processing.loader import load_graph


@click.group("graph")
def graph_group() -> None:
    """Inspect graphs."""


@graph_group.command("show")
@click.argument("graph_ref", metavar="GRAPH")
def graph_show(graph_ref: str) -> None:
    """Print a graph (module:attr or file.py:attr) as a Mermaid flowchart."""
    click.echo(load_graph(graph_ref).mermaid())


__all__ = ["graph_group"]
