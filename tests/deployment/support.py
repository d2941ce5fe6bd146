"""The test webserver's handle and helpers (the fixture is in conftest.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def wait_until_up(server: Webserver) -> None:
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
