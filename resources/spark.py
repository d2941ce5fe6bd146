"""Spark: ``local[*]`` by default; a cluster master or a Spark Connect URL with ``CUES_SPARK_MASTER``."""

from __future__ import annotations

from cues_platform.dagster import CuesSparkResource


def spark_resource() -> CuesSparkResource:
    """One session per run process (dagster-pyspark's lazy resource with the platform defaults);
    ``master`` unset: the run reads ``$CUES_SPARK_MASTER`` (``cues_platform.settings``) when it
    starts its session."""
    return CuesSparkResource()


spark = spark_resource()
