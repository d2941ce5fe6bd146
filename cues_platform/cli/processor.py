"""``cues processor …``: what the lake remembers of each processor id, and forgetting one.

``cues processor ls`` prints the deployments registry (``processing/deployments.py``): every
processor id the lake ran, its strategy, home queue and the queue partitions it reads.
``cues processor forget ID --yes`` is the way out that the redeploy errors name: the id's registry
row and backing queue go, so its positions no longer count and a changed graph may read that
input again (on purpose: that input is delivered again). ``cues_platform/cli/root.py`` adds this group to ``cues``.
"""

from __future__ import annotations

import click
from rich.table import Table

from cues_platform.cli.common import console, lake_option, open_lake
from cues_platform.errors import ConfigurationError
from cues_platform.processing.deployments import Registry, forget


@click.group("processor")
def processor() -> None:
    """The processor ids a lake remembers (the deployments registry)."""


@processor.command("ls")
@lake_option
def processor_ls(lake_root: str) -> None:
    """Every processor id the lake recorded: strategy, home queue, what it reads."""
    shapes = Registry(open_lake(lake_root)).shapes()
    table = Table("processor", "strategy", "home", "reads")
    for pid, s in sorted(shapes.items()):
        table.add_row(pid, s.strategy, s.home or "-",
                      ", ".join(f"{b}={q}/{p}" for b, q, p in s.inputs))
    console.print(table)


@processor.command("forget")
@click.argument("processor_id")
@click.option("--yes", is_flag=True, help="Confirm: the id's input may be delivered again.")
@lake_option
def processor_forget(processor_id: str, yes: bool, lake_root: str) -> None:
    """Forget PROCESSOR_ID's state (registry row, backing queue): its positions no longer count."""
    if not yes:
        raise ConfigurationError(
            f"forgetting processor {processor_id!r} lets a changed graph read its input again (that "
            "input is delivered again): pass --yes to confirm", processor=processor_id)
    removed = forget(open_lake(lake_root), processor_id)
    console.print(f"forgot {processor_id}: " + (", ".join(removed) if removed else "nothing was recorded"))


__all__ = ["processor"]
