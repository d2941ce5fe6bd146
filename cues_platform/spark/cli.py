"""``cues spark …``: Spark engines this machine starts for the platform.

``cues spark cluster up|down|status`` (a standalone Master and Workers, ``spark/cluster.py``) and
``cues spark connect up|down|status`` (a Spark Connect server, ``spark/connect.py``) register
their subgroups here; ``cues_platform/cli/`` adds this group to ``cues``.
"""

from __future__ import annotations

import click

from cues_platform.spark.cluster_cli import cluster
from cues_platform.spark.connect_cli import connect


@click.group("spark")
def spark() -> None:
    """Start and stop the Spark engines the platform attaches to (CUES_SPARK_MASTER)."""


spark.add_command(cluster)
spark.add_command(connect)


__all__ = ["spark"]
