"""What a runner is doing, for operators, supervisors and tests: one event per happening.

``cues run`` emits each event as one JSON line (``--no-progress``: on stderr) and keeps the latest
state in a status file (``--status-file``; written to a temporary file and renamed over the old
one, so a reader never sees half a file). Events, in the order a run makes them:

- ``started``: the graph, the lake, the process id, the processors;
- ``spark_ready``: Spark's start-up time (``seconds``);
- ``recovered``: per processor, what recovery found: ``rolled_forward`` (the step and hash of an
  attempt it delivered) or null, the ``next_step`` and the input ``positions``;
- ``step``: per delivered step, the processor, step, delivery hash, outcome, input ranges and
  row counts;
- ``lane_added``: a partition added to a queue read by an every-partition binding got its lane
  (``processor``: the lane's id, ``family``, ``partition``; processing/lanes.py);
- ``lane_waiting``: a partition added to one of several co-partitioned inputs is held back until
  every such input has it (``family``, ``queue``, ``partition``, ``waits_for``, ``message``);
- ``lane_refused``: the lake's partitions could not be made into lanes, or a new lane would read
  what another processor of its family read (processing/deployments.py); the existing lanes go
  on (``error``: the reason, once per reason);
- ``idle``: no processor had work (once per transition from working to idle);
- ``fenced``: a newer instance of a processor took over (the runner stops);
- ``stopped``: why (``stop requested``, ``idle for Ns``) and the run's duration; or ``failed``:
  the error's type and first line (the process then exits non-zero).

The status file holds ``state`` (``starting``, ``recovering``, ``working``, ``idle``,
``stopped``, ``failed``), the last event, ``spark_start_seconds``, timestamps and per-processor
counters and last step. A status older than the processors' ``poll_interval`` plus a step's
duration while ``state`` is ``working`` or ``idle`` means the runner is stuck or gone.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from cues_platform.processing.step import StepResult

EventSink = Callable[[str, dict[str, Any]], None]

STATES = {"started": "starting", "spark_ready": "recovering", "recovered": "recovering",
          "step": "working", "idle": "idle", "fenced": "stopped", "stopped": "stopped",
          "failed": "failed"}


def step_fields(processor: str, result: StepResult) -> dict[str, Any]:
    return {"processor": processor, "step": result.step, "delivery_hash": result.delivery_hash,
            "outcome": result.outcome, "recovered": result.recovered,
            "ranges": {b: [r.queue, r.partition, r.start, r.end] for b, r in result.inputs.items()},
            "rows_in": result.rows_in, "rows_out": dict(result.rows_out)}


class RunnerStatus:
    """An :data:`EventSink` writing JSON lines to ``stream`` and the state to ``status_file``."""

    def __init__(self, *, graph: str, stream: IO[str] | None = None,
                 status_file: Path | None = None) -> None:
        self.stream, self.status_file = stream, status_file
        self._lock = threading.Lock()
        now = _now()
        self.state: dict[str, Any] = {"graph": graph, "pid": os.getpid(), "state": "starting",
                                      "started_at": now, "updated_at": now,
                                      "spark_start_seconds": None, "processors": {},
                                      "last_event": None}
        if status_file is not None:
            status_file.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        record = {"ts": _now(), "event": event, **fields}
        with self._lock:
            self._fold(event, fields, record)
            if self.stream is not None:
                self.stream.write(json.dumps(record, sort_keys=False, default=str) + "\n")
                self.stream.flush()
            if self.status_file is not None:
                tmp = self.status_file.with_name(f".{self.status_file.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(self.state, indent=2, default=str) + "\n")
                os.replace(tmp, self.status_file)

    def _fold(self, event: str, fields: dict[str, Any], record: dict[str, Any]) -> None:
        state = self.state
        state["state"] = STATES.get(event, state["state"])
        state["updated_at"] = record["ts"]
        state["last_event"] = record
        if event == "spark_ready":
            state["spark_start_seconds"] = fields.get("seconds")
        pid = fields.get("processor")
        if pid is None:
            return
        proc = state["processors"].setdefault(pid, {"steps": 0, "rows_in": 0, "rows_out": 0,
                                                     "errors": 0, "last_step": None,
                                                     "last_delivery_hash": None})
        if event == "recovered":
            proc["next_step"] = fields.get("next_step")
        if event == "step":
            proc["steps"] += 1
            proc["rows_in"] += fields["rows_in"]
            proc["rows_out"] += sum(fields["rows_out"].values())
            proc["errors"] += fields["outcome"] == "error"
            proc["last_step"], proc["last_delivery_hash"] = fields["step"], fields["delivery_hash"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


__all__ = ["STATES", "EventSink", "RunnerStatus", "step_fields"]
