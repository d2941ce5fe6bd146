"""Step 6 of the audit: error rows that a platform failure wrote. Only what the user's function
raises (and a contract break) is a handled failure; an error row whose ``exception_type`` is the
platform's (Delta, the file system, Py4J/Spark, cues_platform itself: see
:func:`cues_platform.processing.failures.origin_of_exception_type`) means the step's input rows
went to the error queue instead of the processor's outputs ([platform_error])."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.audit.report import PLATFORM_ERROR, Violation
from cues_platform.processing.failures import Origin, origin_of_exception_type
from cues_platform.queues import Queue
from cues_platform.queues.based import read_delta
from cues_platform.queues.schema import DELIVERY_HASH, OFFSET, PARTITION

ERROR_COLUMNS = ("processor", "step", "exception_type", "inputs", "message")


def is_error_queue(queue: Queue) -> bool:
    return set(ERROR_COLUMNS) <= set(queue.payload_schema.names)


def platform_error_checks(queues: Mapping[str, Queue]) -> list[Violation]:
    """Every error row in every error queue whose exception is not the user's."""
    bad: list[Violation] = []
    for name, queue in sorted(queues.items()):
        if not is_error_queue(queue):
            continue
        dt = queue.refresh()
        table = read_delta(dt, columns=[*ERROR_COLUMNS, PARTITION, OFFSET, DELIVERY_HASH])
        types = [t for t in pc.unique(table["exception_type"]).to_pylist() if t is not None]
        platform = [t for t in types if origin_of_exception_type(t) is Origin.PLATFORM]
        if not platform:
            continue
        rows = table.filter(pc.is_in(table["exception_type"], pa.array(platform, pa.string())))
        rows = rows.sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])
        runs: list[dict] = []  # contiguous error rows of one (partition, processor, step, type)
        for row in rows.to_pylist():
            last = runs[-1] if runs else None
            key = (row[PARTITION], row["processor"], row["step"], row["exception_type"])
            if last is not None and last["key"] == key and last["end"] == row[OFFSET]:
                last["end"] += 1
            else:
                runs.append({**row, "key": key, "start": row[OFFSET], "end": row[OFFSET] + 1})
        bad += [_violation(name, run) for run in runs]
    return bad


def _violation(queue: str, row: dict) -> Violation:
    message = " ".join(str(row["message"] or "").split())
    if len(message) > 200:
        message = message[:197] + "..."
    return Violation(
        PLATFORM_ERROR,
        f"step {row['step']} of {row['processor']!r} put its input ({_inputs(row['inputs'])}) "
        f"into the error queue because of a platform failure ({row['exception_type']}: {message}), "
        "not an error of its function: those input rows never reached its outputs; fix the "
        "cause, then feed them again (newer versions retry such steps instead)",
        processor=row["processor"], queue=queue, partition=row[PARTITION],
        offsets=(row["start"], row["end"]), hash=row[DELIVERY_HASH], step=row["step"],
    )  # fmt: skip


def _inputs(text: str | None) -> str:
    try:
        inputs = json.loads(text or "{}")
        return ", ".join(
            f"{q}/{p} [{s}, {e})" for _, (q, p, s, e) in sorted(inputs.items())
        ) or "no inputs"
    except (TypeError, ValueError):
        return "inputs not recorded"
