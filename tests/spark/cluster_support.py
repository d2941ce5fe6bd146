"""Helpers for the cluster tests: which worker a process runs under, where executors ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cues_platform.spark.cluster import Cluster, Daemon
from tests.docs.conftest import shell_env
from tests.docs.examples import SHELL, Command, blocks, commands
from tests.support import ROOT

CUES = str(Path(sys.executable).parent / "cues")
DOC, DOC_SECTION = "docs/deployment.md", "Run on a standalone cluster"


def doc_commands() -> dict[str, Command]:
    """The commands of docs/deployment.md's "Run on a standalone cluster" block, by key."""
    return {c.key: c for b in blocks() if b.file == DOC and b.section == DOC_SECTION
            and b.language in SHELL for c in commands(b)}


def run_doc(key: str, *, cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """A documented command run as printed (``bash -c``, the venv's ``cues`` first on PATH)."""
    return subprocess.run(["bash", "-c", doc_commands()[key].text], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=shell_env())


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def worker_of(cluster: Cluster, pid: int) -> Daemon | None:
    """The cluster's worker whose process tree holds ``pid`` (executor JVM, Python workers)."""
    by_pid = {w.pid: w for w in cluster.workers}
    current: int | None = pid
    while current and current > 1:
        if current in by_pid:
            return by_pid[current]
        current = parent_of(current)
    return None


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (the executors a worker launched and their Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (ppid := parent_of(int(entry.name))) is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def executor_dirs(cluster: Cluster, app_id: str) -> dict[str, list[Path]]:
    """Per worker role: the executor folders (``work/<worker>/<app>/<n>``) of application ``app_id``."""
    return {w.role: sorted((Path(cluster.folder) / "work" / w.role / app_id).glob("*"))
            for w in cluster.workers}


def ran_tasks(executor_dir: Path) -> bool:
    stderr = executor_dir / "stderr"
    return stderr.exists() and "Running task" in stderr.read_text(errors="replace")


def app_ids(cluster: Cluster) -> set[str]:
    info = cluster.status()
    return {a["id"] for a in info["activeapps"] + info["completedapps"]}


def run(argv: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
