"""A standalone Spark cluster for the session, started and stopped the way a user does it, with
the commands of docs/deployment.md's "Run on a standalone cluster" exactly as printed, in the
session's temp dir: ``cues spark cluster up`` (a Master and two Workers on 127.0.0.1, random
ports, ``.cues/spark-cluster`` there) and ``cues spark cluster down`` (by PID) as real
subprocesses; whatever still runs afterwards is stopped by PID here. Only ``tests/spark/test_cluster.py`` uses it (one file,
so xdist's ``--dist loadfile`` starts one cluster, not one per worker)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from cues_platform.spark.cluster import Cluster
from cues_platform.spark.daemons import alive
from tests.spark.cluster_support import run_doc


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("spark-cluster")
    folder = home / ".cues" / "spark-cluster"
    # the defaults: two workers offering two cores each, an application gets one on each worker,
    # so two drivers (the harness's concurrent runners) get executors at the same time
    up = run_doc("cues spark cluster up", cwd=home)
    assert up.returncode == 0 and "Traceback" not in up.stderr, up.stdout + up.stderr
    cluster = Cluster.from_dict(json.loads((folder / "state.json").read_text()))
    assert f"export CUES_SPARK_MASTER={cluster.url}" in up.stdout.splitlines(), up.stdout
    assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", cluster.url), cluster.url
    try:
        yield cluster
    finally:
        down = run_doc("cues spark cluster down", cwd=home, timeout=120)
        still = [d.role for d in (cluster.master, *cluster.workers) if alive(d.pid)]
        cluster.stop(grace=5)  # by PID, whatever `down` left (nothing, unless it failed)
    assert down.returncode == 0 and f"stopped {cluster.url}" in down.stdout, down.stdout + down.stderr
    assert not still, f"still running after `cues spark cluster down`: {still}"
    assert not (folder / "state.json").exists()
