"""``cues backing …``: a processor's backing queue in words."""

from __future__ import annotations

import click

from cues_platform.audit import describe_backing
from cues_platform.cli.common import lake_option
from cues_platform.queues import Lake


@click.group()
def backing() -> None:
    """Inspect processors' backing queues."""


@backing.command("show")
@click.argument("processor")
@lake_option
@click.option(
    "-n", "count", default=20, show_default=True, help="How many of the last steps (0: all)."
)
def backing_show(processor: str, lake_root: str, count: int) -> None:
    """A processor's backing queue in words: each step's snapshot and attempt."""
    for line in describe_backing(Lake(root=lake_root), processor, last=count or None):
        click.echo(line)


__all__ = ["backing"]
