"""Fixtures of the documentation tests: a temporary copy of the project's working files to run
the documented commands in, and a runner that executes a command exactly as printed.

The workspace holds copies of what the commands read (``workspace.yaml``, ``definitions.py``,
``assets/``, ``resources/``, ``dagster_home/``, ``bench/``) and ``.venv`` as a link to the venv
running the tests, so ``.venv/bin/...`` and ``$PWD/...`` in a printed command resolve inside it and
whatever the command writes (``lake/``, ``.cues/``, ``bench/results/``) stays there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cues_platform.pgserver_db import stop_embedded_postgres
from tests.docs.examples import Command
from tests.support import ROOT

VENV = Path(sys.prefix)
COPIED = ("workspace.yaml", "definitions.py", "assets", "resources", "dagster_home", "bench")
_IGNORED = shutil.ignore_patterns("__pycache__", "history", "storage", "schedules", "logs", ".*",
                                  "*-quick.json")


def make_workspace(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, base / name, ignore=_IGNORED)
        else:
            shutil.copy2(src, base / name)
    (base / ".venv").symlink_to(VENV, target_is_directory=True)
    return base


def shell_env(**extra: str) -> dict[str, str]:
    """The user's environment with the venv's bin first on PATH (``cues`` as after activation);
    ``CUES_LAKE`` / ``DAGSTER_HOME`` / ``CUES_POSTGRES_DSN`` removed so the documented defaults
    apply (each command sets what it needs itself)."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"CUES_LAKE", "DAGSTER_HOME", "CUES_POSTGRES_DSN", "PYTHONPATH"}}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_printed(cmd: Command | str, cwd: Path, *, timeout: float, env: dict[str, str] | None = None,
                expect: int = 0) -> subprocess.CompletedProcess[str]:
    """Run a documented command with ``bash -c`` as printed; assert its exit code and that no Python
    traceback reached stderr."""
    text = cmd.text if isinstance(cmd, Command) else cmd
    where = cmd.where if isinstance(cmd, Command) else "command"
    proc = subprocess.run(["bash", "-c", text], cwd=cwd, env=env or shell_env(), capture_output=True,
                          text=True, timeout=timeout)
    tail = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == expect, f"{where}: `{text}` exited {proc.returncode}, expected {expect}{tail}"
    assert "Traceback" not in proc.stderr, f"{where}: `{text}` printed a traceback{tail}"
    return proc


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A fresh workspace; stops the embedded PostgreSQL servers a command left under ``.cues/``.

    It lives outside pytest's basetemp (as ``pg_dsn``'s server in tests/conftest.py does): concurrent
    pytest sessions of the same user rotate those folders and make their parent private again, under
    a running server whose own user then cannot reach its data directory.
    """
    base = Path(tempfile.mkdtemp(prefix="cues-docs-ws-"))
    ws = make_workspace(base / "ws")
    try:
        yield ws
    finally:
        for pg in (ws / ".cues" / "postgres", ws / ".cues" / "participants" / "pg"):
            if pg.exists():
                stop_embedded_postgres(pg)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def chdir_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in-process examples in an empty temporary working directory ("lake" stays inside)."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def exec_block() -> Callable[..., dict]:
    """Execute python blocks as printed, in order, in one fresh namespace (a script's globals)."""

    def run(*blocks: object, namespace: dict | None = None) -> dict:
        ns = namespace if namespace is not None else {"__name__": "__main__"}
        for block in blocks:
            exec(compile(block.text, block.where, "exec"), ns)  # noqa: S102 - the documented example
        return ns

    return run
