"""The platform on a real standalone Spark cluster (a Master and two Workers, separate JVMs):
the reference pipeline and the fault harness run exactly once with
``CUES_SPARK_MASTER=spark://127.0.0.1:PORT``, and a worker killed in the middle of a step costs a
task retry, not a duplicate. Every driver is a real subprocess; the executors are the workers'.

The worker-kill test is last in this file: it leaves the session's cluster with one worker.
CI runs the command's checks and the worker kill; ``CUES_SOAK=1`` adds the reference pipeline
(1,000 postings) and the harness at docs/jepsen.md's bounded size, on the same cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cues_platform.spark.cluster import Cluster
from cues_platform.spark.daemons import alive, kill_group
from tests.spark.cluster_support import (
    CUES,
    app_ids,
    descendants,
    doc_commands,
    executor_dirs,
    ran_tasks,
    run,
    run_doc,
    worker_of,
)
from tests.support import ROOT, soak_enabled

pytestmark = [pytest.mark.slow, pytest.mark.soak]
# Each driver on the cluster starts in 25-35 s on this machine's two busy cores (local[*]: 13-20 s),
# so the pipeline (120 s at 1,000 postings) and the harness (190 s, five runner starts) would take
# CI past its budget for these tests: they run with CUES_SOAK=1 (numbers: docs/deployment.md).
soak_only = pytest.mark.skipif(not soak_enabled(), reason="CUES_SOAK=1: the pipeline and the harness "
                               "on the cluster (2 and 3 minutes here)")
MESSAGES = 1_000
HARNESS = ["--duration", "40", "--keys", "1500"]  # docs/jepsen.md's bounded run


def on_cluster(cluster: Cluster) -> dict[str, str]:
    return {"CUES_SPARK_MASTER": cluster.url}


def assert_executors_ran_on_both_workers(cluster: Cluster, new_apps: set[str]) -> None:
    assert new_apps, "no application registered with the master: the driver ran Spark locally"
    for app in new_apps:
        dirs = executor_dirs(cluster, app)
        assert all(dirs.values()), f"{app}: an executor on each worker expected, found {dirs}"
        assert any(ran_tasks(d) for ds in dirs.values() for d in ds), f"{app}: no executor ran a task"


def cluster_command(*args: str) -> tuple[int, str]:
    proc = run([CUES, "spark", "cluster", *args], timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_cluster_status_and_a_second_up_or_a_taken_port_refused(spark_cluster):
    # the session's cluster was started with docs/deployment.md's commands (conftest.py)
    assert list(doc_commands()) == ["cues spark cluster up", "cues spark cluster status",
                                    "cues spark cluster down"]
    folder = spark_cluster.folder
    status = run_doc("cues spark cluster status", cwd=Path(folder).parents[1])
    out = status.stdout + status.stderr
    assert status.returncode == 0 and f"up: {spark_cluster.url}" in out and "workers ALIVE: 2 of 2" in out, out
    assert spark_cluster.status()["aliveworkers"] == 2
    # a second up from the same folder while it runs: refused, naming the running cluster
    code, out = cluster_command("up", "--dir", folder)
    assert code == 2 and out.startswith("error: a cluster started from") and spark_cluster.url in out, out
    assert "cues spark cluster down" in out
    assert json.loads((Path(folder) / "state.json").read_text())["master"]["pid"] == spark_cluster.master.pid
    # the master's port for another cluster: refused before any JVM starts
    other = Path(folder).parent / "other-cluster"
    code, out = cluster_command("up", "--dir", str(other), "--port", str(spark_cluster.master.port))
    assert code == 2 and f"port {spark_cluster.master.port} on 127.0.0.1 is taken" in out, out
    assert not (other / "logs").exists()
    assert all(alive(d.pid) for d in (spark_cluster.master, *spark_cluster.workers))


@soak_only
def test_the_reference_pipeline_runs_exactly_once_on_the_cluster(spark_cluster, tmp_path):
    before = app_ids(spark_cluster)
    lake = tmp_path / "lake"
    proc = run([CUES, "demo", "--engine", "runner", "--messages", str(MESSAGES), "--lake", str(lake)],
               cwd=tmp_path, env=on_cluster(spark_cluster))  # the embedded PostgreSQL under tmp_path
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"reconciliation\s*│\s*exact", out) and re.search(r"audit \(exactly-once\)\s*│\s*clean", out), out[-3000:]
    audit = run([CUES, "audit", "--lake", str(lake)])
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "clean" in audit.stdout.lower() or "ok" in audit.stdout.lower(), audit.stdout
    # the driver was a client of the master: executors in the workers' JVMs ran its tasks
    new = app_ids(spark_cluster) - before
    assert len(new) == 1, new
    assert_executors_ran_on_both_workers(spark_cluster, new)


@soak_only
@pytest.mark.timeout(1800)
def test_the_fault_harness_passes_on_the_cluster(spark_cluster, tmp_path):
    before = app_ids(spark_cluster)
    proc = run([sys.executable, "-m", "cues_platform.jepsen", *HARNESS, "--workdir", str(tmp_path / "j")],
               env={**on_cluster(spark_cluster), "TMPDIR": str(tmp_path)}, timeout=1700)
    seed = proc.stdout.splitlines()[0] if proc.stdout else "?"
    assert proc.returncode == 0, f"{seed} FAILED:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    report = json.loads((tmp_path / "j" / "report.json").read_text())
    assert report["ok"] and all(c["ok"] for c in report["report"]["checks"]), report
    assert all(c["checked"] > 0 for c in report["report"]["checks"]), report
    assert sum(report["kills"].values()) >= 3 and report["runner_starts"] >= 3, report
    assert report["acked"] == report["keys"], report
    # the runners were drivers of the cluster (those killed while starting may not have registered),
    # their tasks ran in executors on both workers
    new = app_ids(spark_cluster) - before
    assert 1 <= len(new) <= report["runner_starts"], (new, report["runner_starts"])
    assert_executors_ran_on_both_workers(spark_cluster, {a for a in new if any(
        ran_tasks(d) for ds in executor_dirs(spark_cluster, a).values() for d in ds)})


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_step_is_retried_and_the_output_is_exactly_once(spark_cluster, tmp_path):
    barrier, lake = tmp_path / "barrier", tmp_path / "lake"
    barrier.mkdir()
    driver = subprocess_driver(spark_cluster, lake, barrier)
    try:
        first = wait_for_arrival(barrier, driver)
        victim = worker_of(spark_cluster, first)
        assert victim is not None, f"the gated task's Python worker {first} is under no worker"
        doomed = descendants(victim.pid)
        kill_group(victim.pid)  # SIGKILL the worker JVM and its executor (their process group)
        for pid in doomed:  # and the Python workers (pyspark's daemon has a group of its own)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        (barrier / "release").write_text("")
        out, err = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, err[-4000:]
    assert json.loads(out.strip().splitlines()[-1])["steps"] == 2
    # each gate marker holds its executor's folder, work/<worker>/<app>/<n>: some attempt ran on
    # the worker that was not killed (Spark's retry of the lost task, or the step's later jobs)
    workers = {Path(m.read_text()).parts[-3] for m in barrier.glob("arrived-*")}
    assert victim.role in workers and workers - {victim.role}, (workers, victim.role)
    # the driver saw the task lost with its executor and ran it again (Spark's WARN lines)
    assert re.search(r"Lost task .*ExecutorLostFailure|Lost executor", err), err[-3000:]
    # exactly once: every input id once in b, offsets dense, written by the executors; audit clean
    table = DeltaTable(str(lake / "queues" / "b")).to_pyarrow_table()
    assert sorted(table["id"].to_pylist()) == list(range(60))
    assert sorted(table["_offset"].to_pylist()) == list(range(60))
    files = DeltaTable(str(lake / "queues" / "b")).file_uris()
    assert files and all("/step-" in f for f in files), files
    audit = run([CUES, "audit", "--lake", str(lake)])
    assert audit.returncode == 0, audit.stdout + audit.stderr


def subprocess_driver(cluster: Cluster, lake, barrier):
    import subprocess

    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "spark" / "barrier_job.py"), str(lake),
                             str(barrier)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **on_cluster(cluster), "CUES_SPARK_LOG_LEVEL": "WARN"})


def wait_for_arrival(barrier, driver) -> int:
    """The PID of the first Python worker inside the gate (polls the folder; the driver must live)."""
    import time

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        arrived = sorted(barrier.glob("arrived-*"), key=lambda p: p.stat().st_mtime)
        if arrived:
            return int(arrived[0].name.split("-")[1])
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited before the step reached the gate: {driver.stderr.read()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError("no task reached the gate in 600 s")
