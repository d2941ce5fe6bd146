"""What every Spark of the platform shares, below both the session (client) and the servers it
starts (``connect.py``, ``cluster.py``): the Java check, the session defaults, the log config.

Nothing here imports pyspark or starts anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from cues_platform.errors import JavaNotFoundError
from cues_platform.settings import current

MIN_JAVA = 17
HOST = "127.0.0.1"  # every Spark daemon this machine starts binds here

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.enableVectorizedReader": "true",
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    # steps written by the executors (processing/executor_output.py): Arrow's timestamp[us, UTC]
    # in the files, and no _SUCCESS marker in a queue's folder
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}

# Only where the driver reads the same files as the executors (local masters): a step reads the
# data files the Delta log names, one path each; past 32 paths Spark lists them with a Spark job
# of its own (parallel partition discovery), a job per step the protocol does not need. On a
# cluster over object storage the parallel listing may pay off, so it is left as Spark has it.
LOCAL_FILES_DEFAULTS = {
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}

# Session settings a Spark Connect client sets on attach (runtime SQL settings; the static ones
# are the server's).
SESSION_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"


def java_major_version() -> int | None:
    """The major version of the ``java`` Spark will use (JAVA_HOME first), or None."""
    home = current().java_home
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> int:
    version = java_major_version()
    if version is None or version < MIN_JAVA:
        found = "no java on PATH or JAVA_HOME" if version is None else f"Java {version}"
        raise JavaNotFoundError(
            f"Spark needs Java {MIN_JAVA}+ but found {found}: install it (Debian/Ubuntu: "
            f"apt-get install openjdk-17-jre-headless) or set JAVA_HOME",
            found=version,
        )
    return version
