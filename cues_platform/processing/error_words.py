"""Error rows in words: the input a row names and its exception's one line (``cues errors list``,
the Dagster ``errors`` asset's sample)."""

from __future__ import annotations

import json


def inputs_in_words(inputs: str) -> str:
    """``a/0@13`` for a one-offset range, ``a/0[10, 20)`` for a step's range; bindings joined."""
    parts = []
    for queue, partition, start, end in json.loads(inputs).values():
        if end - start == 1:
            parts.append(f"{queue}/{partition}@{start}")
        elif end > start:
            parts.append(f"{queue}/{partition}[{start}, {end})")
    return ", ".join(parts) or "-"


def _short(text: str | None, width: int) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def headline(exception_type: str, message: str | None) -> str:
    """``Class: message`` in one line; for a UDF that raised on an executor, the user's own line
    from the worker's traceback (the message's first line is Spark's)."""
    short = exception_type.rsplit(".", 1)[-1]
    lines = (message or "").strip().splitlines()
    for line in reversed(lines):
        if f"{short}: " in line:
            return _short(f"{short}: " + line.split(f"{short}: ", 1)[1], 160)
    return _short(f"{short}: {lines[0] if lines else ''}", 160)


__all__ = ["headline", "inputs_in_words"]
