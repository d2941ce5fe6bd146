"""get_spark makes Spark's Python workers run this interpreter unless the user chose another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

CHILD = """
import os, sys
from pyspark.sql import functions as F
from pyspark.sql.types import StringType
from cues_platform.spark import get_spark

spark = get_spark()
print("ENV", os.environ["PYSPARK_PYTHON"], os.environ["PYSPARK_DRIVER_PYTHON"], flush=True)
# A pandas/Arrow UDF needs pyarrow on the worker: the PATH's python3 below has none.
worker = F.pandas_udf(lambda s: s.map(lambda _: sys.executable), StringType())
print("WORKER", spark.range(1).select(worker(F.col("id").cast("string"))).first()[0], flush=True)
"""


def test_workers_run_this_python_when_the_user_set_none(tmp_path: Path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "python"):  # what Spark runs by default: a python without pyarrow
        script = fake / name
        script.write_text("#!/bin/sh\necho 'not the python you want' >&2\nexit 3\n")
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(PATH=f"{fake}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line[:3] in ("ENV", "WOR"))
    assert lines["ENV"] == f"{sys.executable} {sys.executable}"
    assert lines["WORKER"] == sys.executable
    # a quiet start: no banner, no log-level notice, no warning (only the JVM's own module line)
    for noise in ("Using Spark's default log4j profile", "Setting default log level", "NativeCodeLoader", " WARN "):
        assert noise not in proc.stderr, proc.stderr[-2000:]


def test_the_users_driver_java_options_come_after_the_quiet_log_configuration():
    from cues_platform.spark.session import LOG_CONFIG, SparkSettings, driver_java_options

    assert LOG_CONFIG.is_file()
    assert driver_java_options(SparkSettings()) == f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    mine = SparkSettings(conf={"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=/etc/mine.xml -Xss4m"})
    assert driver_java_options(mine).endswith(" -Dlog4j2.configurationFile=/etc/mine.xml -Xss4m")


def test_a_python_the_user_chose_is_kept(monkeypatch):
    from cues_platform.spark.session import SparkSettings, use_this_python

    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/team/python")
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/opt/team/python-driver")
    use_this_python(SparkSettings())
    assert os.environ["PYSPARK_PYTHON"] == "/opt/team/python"
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == "/opt/team/python-driver"
    monkeypatch.delenv("PYSPARK_PYTHON")
    use_this_python(SparkSettings(conf={"spark.pyspark.python": "/opt/conf/python"}))
    assert "PYSPARK_PYTHON" not in os.environ  # spark.pyspark.python decides
