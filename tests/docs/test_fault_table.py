"""Every test a fault-table row of docs/guarantees.md names exists: a row whose test was renamed
or deleted would be a claim without proof."""

from __future__ import annotations

import ast
import re

from tests.support import ROOT

REF = re.compile(r"`([\w/]+\.py)::(\w+)")
SAME_FILE = re.compile(r"`::(\w+)")


def _candidates(path: str) -> list:
    """``queues/test_x.py`` (relative to tests/), ``tests/...``, or a bare file name (rows of a
    section about one folder name only the file): every file it may mean."""
    path = path.removeprefix("tests/")
    if "/" in path:
        return [ROOT / "tests" / path]
    return list((ROOT / "tests").rglob(path))


def _functions(file) -> set[str]:  # noqa: ANN001 - a Path
    if not file.exists():
        return set()
    return {n.name for n in ast.walk(ast.parse(file.read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_named_in_the_fault_tables_exists() -> None:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    missing = []
    checked = 0
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        current = None
        for m in re.finditer(r"`([\w/]+\.py)::(\w+)|`::(\w+)", line):
            path, name = (m.group(1), m.group(2)) if m.group(1) else (current, m.group(3))
            if path is None:
                missing.append(f"{name}: no file named before it in: {line[:80]}")
                continue
            current = path
            checked += 1
            if not any(name in _functions(f) for f in _candidates(path)):
                missing.append(f"tests/{path}::{name}")
    assert checked > 100
    assert not missing, "docs/guarantees.md names tests that do not exist:\n" + "\n".join(missing)
