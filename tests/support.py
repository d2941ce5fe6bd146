"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])


def soak_enabled() -> bool:
    """Full-size soak/crash tests with CUES_SOAK=1; CI runs them bounded."""
    return os.environ.get("CUES_SOAK") == "1"


def rows(start: int, count: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + count), pa.int64()),
            "note": [f"n{i}" for i in range(start, start + count)],
        }
    )
