"""The deployment's webserver, shared by the smoke and browser tests (one per test session).

``dagster-webserver -h 127.0.0.1 -p <free port> -w workspace.yaml`` from the project root, as a
real subprocess, with ``DAGSTER_HOME`` = a temporary copy of ``dagster_home/`` (sqlite), the lake
in a temporary folder (``CUES_LAKE``) and the ledger's embedded PostgreSQL in a temporary folder
(``CUES_POSTGRES_DIR``; started by the first run that books, stopped at teardown). There is no
daemon here, so the copy of ``dagster.yaml`` uses Dagster's ``DefaultRunCoordinator``: a launched
run starts at once instead of waiting in the queue for the daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cues_platform.pgserver_db import DSN_ENV, stop_embedded_postgres
from tests.deployment.support import Webserver, free_port, wait_until_up
from tests.support import ROOT

SENSOR_INTERVAL = 5  # seconds: CUES_SENSOR_INTERVAL of the `deployment` fixture


@pytest.fixture(scope="session")
def webserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webserver]:
    tmp = tmp_path_factory.mktemp("webserver")
    home = tmp / "dagster_home"
    shutil.copytree(ROOT / "dagster_home", home, ignore=shutil.ignore_patterns("history", "storage", "schedules",
                                                                              "logs", ".*"))
    with (home / "dagster.yaml").open("a") as f:
        f.write("\n# test: no daemon, so runs start at once\nrun_coordinator:\n"
                "  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n")
    lake_root = str(tmp / "lake")
    pg_dir = tmp / "postgres"
    env = {**os.environ, "DAGSTER_HOME": str(home), "CUES_LAKE": lake_root, "CUES_POSTGRES_DIR": str(pg_dir),
           "PYTHONPATH": str(ROOT)}
    port = free_port()
    log = tmp / "webserver.log"
    webserver_bin = Path(sys.executable).parent / "dagster-webserver"
    with log.open("w") as out:
        proc = subprocess.Popen([str(webserver_bin), "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Webserver(f"http://127.0.0.1:{port}", proc, log, lake_root, pg_dir, home)
    try:
        wait_until_up(server)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the webserver and its code-server child
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if not os.environ.get(DSN_ENV, "").strip():
            stop_embedded_postgres(pg_dir)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webserver]:
    """``dagster dev`` as a data engineer starts it: the webserver AND the daemon (sensors, schedules,
    the queued run coordinator of ``dagster.yaml``: one run at a time), on a temporary copy of
    ``dagster_home/`` (sqlite), a temporary lake with the payments graph's queues created and empty
    (a drained lake), the participants' lake and databases and the ledger's PostgreSQL in temporary
    folders. Automation is on as deployed: every sensor and schedule keeps its default status; the
    sensors tick every ``SENSOR_INTERVAL`` seconds (``CUES_SENSOR_INTERVAL``, 30 s by default)."""
    from cues_platform.processing.runner import create_queues
    from cues_platform.queues import Lake
    from cues_platform.reference.pipeline import payments_graph

    tmp = tmp_path_factory.mktemp("deployment")
    home = tmp / "dagster_home"
    shutil.copytree(ROOT / "dagster_home", home, ignore=shutil.ignore_patterns("history", "storage", "schedules",
                                                                              "logs", ".*"))
    lake_root = str(tmp / "lake")
    create_queues(payments_graph(), Lake(root=lake_root))
    pg_dir = tmp / "postgres"
    env = {**os.environ, "DAGSTER_HOME": str(home), "CUES_LAKE": lake_root, "CUES_POSTGRES_DIR": str(pg_dir),
           "CUES_PARTICIPANTS_LAKE": str(tmp / "lake-participants"),
           "CUES_PARTICIPANTS_DATA": str(tmp / "participants"), "PYTHONPATH": str(ROOT),
           "CUES_SENSOR_INTERVAL": str(SENSOR_INTERVAL)}
    port = free_port()
    log = tmp / "dagster-dev.log"
    dagster_bin = Path(sys.executable).parent / "dagster"
    with log.open("w") as out:
        proc = subprocess.Popen([str(dagster_bin), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Webserver(f"http://127.0.0.1:{port}", proc, log, lake_root, pg_dir, home)
    try:
        wait_until_up(server)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # dagster dev, its webserver, daemon and code servers
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if not os.environ.get(DSN_ENV, "").strip():
            stop_embedded_postgres(pg_dir)
