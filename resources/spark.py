"""Spark: ``local[*]`` by default; a cluster master or a Spark Connect URL with ``CUES_SPARK_MASTER``."""

from __future__ import annotations

import os

from dagster import EnvVar

from cues_platform.dagster import CuesSparkResource


def spark_resource() -> CuesSparkResource:
    """One session per run process (dagster-pyspark's lazy resource with the platform defaults)."""
    if os.environ.get("CUES_SPARK_MASTER"):
        return CuesSparkResource(master=EnvVar("CUES_SPARK_MASTER"))
    return CuesSparkResource()


spark = spark_resource()
