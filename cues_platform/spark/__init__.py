"""Spark sessions for cues_platform (local, cluster master, or Spark Connect)."""

from cues_platform.spark.session import SparkSettings, get_spark, java_major_version

__all__ = ["SparkSettings", "get_spark", "java_major_version"]
