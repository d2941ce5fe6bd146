"""The deployment's webserver, shared by the smoke and browser tests (one per test session).

``dagster-webserver -h 127.0.0.1 -p <free port> -w workspace.yaml`` from the project root, as a
real subprocess, with ``DAGSTER_HOME`` = a temporary copy of ``dagster_home/`` (sqlite), the lake
in a temporary folder (``CUES_LAKE``) and the ledger's embedded PostgreSQL in a temporary folder
(``CUES_POSTGRES_DIR``; started by the first run that books, stopped at teardown). There is no
daemon here, so the copy of ``dagster.yaml`` uses Dagster's ``DefaultRunCoordinator``: a launched
run starts at once instead of waiting in the queue for the daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cues_platform.pgserver_db import DSN_ENV, stop_embedded_postgres
from tests.support import ROOT

LOCATION = "cues_platform"  # workspace.yaml's location_name
START_TIMEOUT = 240.0  # the code location imports Dagster, pyspark and the assets (slow on 2 busy cores)


class DeploymentTestError(AssertionError):
    """The webserver or a run did not do what the test needs (with its log)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Webserver:
    url: str
    proc: subprocess.Popen
    log: Path
    lake_root: str
    pg_dir: Path
    home: Path

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def graphql(self, query: str, variables: dict[str, Any] | None = None, *, timeout: float = 60) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out = json.loads(resp.read())
        if out.get("errors"):
            raise DeploymentTestError(f"GraphQL errors: {out['errors']}")
        return out["data"]


def _wait_until_up(server: Webserver) -> None:
    """Poll /server_info, then the workspace, until the code location is loaded (bounded)."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if server.proc.poll() is not None:
            raise DeploymentTestError(f"dagster-webserver exited ({server.proc.returncode}):\n{server.tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/server_info", timeout=5) as resp:
                if resp.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise DeploymentTestError(f"dagster-webserver not up after {START_TIMEOUT}s:\n{server.tail()}")
        time.sleep(0.5)
    query = """{ workspaceOrError { __typename ... on Workspace { locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
    while True:
        entries = server.graphql(query)["workspaceOrError"]["locationEntries"]
        entry = next(e for e in entries if e["name"] == LOCATION)
        if entry["loadStatus"] == "LOADED":
            if entry["locationOrLoadError"]["__typename"] != "RepositoryLocation":
                raise DeploymentTestError(f"code location failed to load: {entry['locationOrLoadError']}")
            return
        if time.monotonic() > deadline:
            raise DeploymentTestError(f"code location not loaded after {START_TIMEOUT}s:\n{server.tail()}")
        time.sleep(0.5)


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
        _wait_until_up(server)
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
