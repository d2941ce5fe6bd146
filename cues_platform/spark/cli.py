"""``cues spark …``: Spark engines this machine starts for the platform.

``cues spark cluster up|down|status`` (a standalone Master and Workers, ``spark/cluster.py``) and
``cues spark connect up|down|status`` (a Spark Connect server, ``spark/connect.py``) register
their subgroups here; ``cli.py`` adds this group to ``cues``.
"""

from __future__ import annotations

import click


@click.group("spark")
def spark() -> None:
    """Start and stop the Spark engines the platform attaches to (CUES_SPARK_MASTER)."""


spark.add_command(__import__("cues_platform.spark.cluster_cli", fromlist=["cluster"]).cluster)
spark.add_command(__import__("cues_platform.spark.connect_cli", fromlist=["connect"]).connect)


__all__ = ["spark"]
