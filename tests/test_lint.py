"""Lint is part of the suite (so `.ci/run`, which runs the README's test command, runs it): the
whole project passes `ruff check` with the rules in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_ruff_finds_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
