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


def spark_explained(frame, mode: str) -> str:
    """``frame.explain(mode=mode)`` as text, on a classic session or over Spark Connect."""
    if hasattr(frame, "_explain_string"):  # Spark Connect: the server explains
        return frame._explain_string(mode=mode)
    return frame.sparkSession._jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), mode)


def generated_code(frame) -> str:
    """The Java source Spark compiles for ``frame``'s whole-stage codegen, without the plan text
    above it (which prints literal values whatever the code holds)."""
    text = spark_explained(frame, "codegen")
    assert "Generated code:" in text, text  # a plan without codegen would prove nothing
    return text.split("Generated code:", 1)[1]
