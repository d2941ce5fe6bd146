"""Error queues in the asset graph: every contract break and processor error lands there, so the
operator sees them as assets with an edge from each processor that writes them.

An error queue is not a processor output (no op materializes it): it is an ``AssetSpec`` whose
deps are the asset keys of the processors that write it. Each processor materialization logs an
``AssetObservation`` on it, read from the queue itself (the counts are the lake's, not the run's
memory):

- ``cues/by_processor``: the rows by processor (lane) and reason (the error rows' ``exception_type``,
  e.g. ``cues_platform.ContractViolation`` or the user's own exception);
- ``cues/isolated_rows``, ``cues/whole_step_rows``, ``cues/contract_break_rows``: what kind of
  row each is. An *isolated row* is one input row a step's function failed on
  (``processing/isolation.py``: the row itself in ``payload``); a *whole-step row* stands for a
  step that failed as a whole (``Options.on_error = whole_step``, a sink, a processor without
  inputs to split; no ``payload``); a *contract break* is an output row that broke its queue's
  contract (``payload`` = that row). A row left unsplit when the isolation budget was spent
  (``max_isolation_calls``) is one input row with its payload: an isolated row;
- with the graph given, ``cues/pending_rows`` (rows ``replay_errors`` would re-feed),
  ``cues/replayed_rows`` (rows a replay step already re-fed: in a lane's replay log,
  ``processing/replay.py``) and ``cues/not_replayable_rows`` (contract breaks, rows of a sink or
  of a processor that is not exactly_once);
- ``cues/newest_rows``: a markdown table of the newest rows (processor, step, the input row as
  ``queue/partition@offset``, the exception, the first line of its message, the row as JSON).

Cost: the counts read four columns of every row (``_offset``, ``processor``, ``exception_type``,
``payload``: Delta keeps no statistics of these), ``COUNT_CHUNK`` offsets at a time, so memory is
bounded; measured 1 to 2.5 s per million error rows on the project's shared 2-core machine, nearly
all of it the queue's reader. With the graph, each lane's replay log is its backing queue's
``snapshot`` column (``replay.replayed_refs``). The sample reads only the newest ``SAMPLE_ROWS``
offsets of each partition (``Queue.next_offset``): the files holding them, never the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetDep, AssetKey, AssetObservation, AssetSpec, MetadataValue
from deltalake import DeltaTable

from cues_platform.processing.backing import BackingOf, BackingQueue, ErrorRef
from cues_platform.processing.error_words import headline, inputs_in_words
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE
from cues_platform.processing.graph import Graph
from cues_platform.processing.replay import ReplayRefusedError, replayable, replayed_refs
from cues_platform.queues import Lake, Queue
from cues_platform.queues.reader import read_present
from cues_platform.queues.schema import OFFSET, PARTITION

SAMPLE_ROWS = 10  # rows in cues/newest_rows
PAYLOAD_WIDTH = 120  # characters of the row's JSON shown in cues/newest_rows
MESSAGE_WIDTH = 160
COUNT_CHUNK = 1_000_000  # offsets per read while counting

ISOLATED, WHOLE_STEP, CONTRACT_BREAK = "isolated_row", "whole_step", "contract_break"
PENDING, REPLAYED, NOT_REPLAYABLE = "pending", "replayed", "not_replayable"
SAMPLE_COLUMNS = [OFFSET, PARTITION, "processor", "step", "inputs", "exception_type", "message",
                  "failed_at", "payload"]


def error_queue_writers(graph: Graph) -> dict[str, list[str]]:
    """``{error queue: [processor ids that write it]}`` in topological order."""
    out: dict[str, list[str]] = {}
    for pid in graph.family_order():
        err = graph.error_queue_of(graph.as_declared(pid))
        if err:
            out.setdefault(err, []).append(pid)
    return out


def error_queue_spec(graph: Graph, name: str, writer_keys: Sequence[AssetKey], *,
                     key: AssetKey, group_name: str | None) -> AssetSpec:
    deps: list[AssetDep] = []
    for k in writer_keys:
        if all(d.asset_key != k for d in deps):
            deps.append(AssetDep(k))
    return AssetSpec(
        key, deps=deps, group_name=group_name, kinds={"delta"},
        tags={"cues/role": "error_queue"},
        description=(f"Error queue {name!r} of graph {graph.name!r}: one row per input row a "
                     "processor's function failed on (isolated: the row itself as JSON), per step "
                     "that failed whole, and per row that broke an output queue's contract. Its "
                     "observations count the rows by processor and reason, by kind, pending and "
                     "replayed, and show the newest ones."),
        metadata={"cues/queue": name},
    )


# -- counting ---------------------------------------------------------------------------------------
@dataclass
class ErrorSummary:
    """The counts of one error queue (see the module docstring)."""

    queue: str
    by_processor: dict[str, dict[str, int]] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=lambda: {ISOLATED: 0, WHOLE_STEP: 0, CONTRACT_BREAK: 0})
    replay: dict[str, int] | None = None  # PENDING / REPLAYED / NOT_REPLAYABLE, with the graph

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


def _chunks(queue: Queue, partition: str, columns: list[str]) -> Any:
    """The rows of ``partition`` up to its end at the start, ``COUNT_CHUNK`` offsets at a time;
    rows retention removes meanwhile are not counted (never an error: each chunk is what one
    snapshot holds)."""
    lo, end = queue.start_offset(partition), queue.next_offset(partition)
    while lo < end:
        table, first = read_present(queue, partition=partition, start=lo,
                                    end=min(end, lo + COUNT_CHUNK), columns=columns)
        yield table
        lo = max(lo + COUNT_CHUNK, first)


def _kinds(table: pa.Table) -> pa.Array:
    """Each row's kind: a contract break by its exception type, an isolated row by its payload."""
    contract = pc.equal(table["exception_type"], CONTRACT_EXCEPTION_TYPE)
    isolated = pc.is_valid(table["payload"])
    return pc.if_else(contract, CONTRACT_BREAK, pc.if_else(isolated, ISOLATED, WHOLE_STEP))


def summarize(lake: Lake, name: str, *, replayed: Mapping[str, set[int]] | None = None,
              replayable_lanes: set[str] | None = None) -> ErrorSummary:
    """The counts of the error queue ``name``. With ``replayed`` (``{partition: error row
    offsets in a replay log}``) and ``replayable_lanes`` (the lanes ``replay_errors`` accepts),
    also the rows pending, replayed and not replayable."""
    queue = lake.queue(name)
    summary = ErrorSummary(name)
    with_replay = replayed is not None and replayable_lanes is not None
    if with_replay:
        summary.replay = {PENDING: 0, REPLAYED: 0, NOT_REPLAYABLE: 0}
    by: dict[tuple[str, str], int] = {}
    for part in queue.partitions:
        done = pa.array(sorted((replayed or {}).get(part, set())), type=pa.int64())
        for table in _chunks(queue, part, [OFFSET, "processor", "exception_type", "payload"]):
            if table.num_rows == 0:
                continue
            kind = _kinds(table)
            slim = pa.table({"processor": table["processor"], "exception_type": table["exception_type"],
                             "kind": kind})
            for row in slim.group_by(["processor", "exception_type", "kind"]).aggregate(
                    [([], "count_all")]).to_pylist():
                key = (row["processor"], row["exception_type"])
                by[key] = by.get(key, 0) + row["count_all"]
                summary.kinds[row["kind"]] += row["count_all"]
            if summary.replay is not None:
                state = _replay_state(table, kind, done, replayable_lanes or set())
                for value, n in zip(*pc.value_counts(state).flatten(), strict=True):
                    summary.replay[value.as_py()] += n.as_py()
    for (proc, reason), n in sorted(by.items()):
        summary.by_processor.setdefault(proc, {})[reason] = n
    return summary


def _replay_state(table: pa.Table, kind: pa.Array, done: pa.Array, lanes: set[str]) -> pa.Array:
    was_replayed = pc.is_in(table[OFFSET], value_set=done)
    can = pc.and_(pc.not_equal(kind, CONTRACT_BREAK),
                  pc.is_in(table["processor"], value_set=pa.array(sorted(lanes), type=pa.string())))
    return pc.if_else(was_replayed, REPLAYED, pc.if_else(can, PENDING, NOT_REPLAYABLE))


def error_counts(lake: Lake, name: str) -> dict[str, dict[str, int]]:
    """``{processor: {exception_type: rows}}`` of the error queue ``name``."""
    return summarize(lake, name).by_processor


def replay_log(lake: Lake, graph: Graph, name: str, *,
               backing_of: BackingOf | None = None) -> tuple[dict[str, set[int]], set[str]]:
    """``({partition: offsets of error rows of ``name`` a replay step re-fed}, {lanes whose rows
    replay_errors accepts})`` over the lanes of ``graph`` that write ``name`` (those of
    partitions added in the lake since the graph was built included). A lane's replay log is
    read only when its backing queue exists (never created here): through ``backing_of`` (the
    ``backing`` resource's) when given."""
    current = graph.with_lake_partitions({q: lake.queue(q).partitions for q in graph.queues
                                          if lake.has_queue(q)})
    done: dict[str, set[int]] = {}
    accepted: set[str] = set()
    for lane, proc in current.processors.items():
        if current.error_queue_of(proc) != name:
            continue
        try:
            replayable(current.as_declared(proc.family or proc.id))
        except ReplayRefusedError:
            continue
        accepted.add(lane)
        if not DeltaTable.is_deltatable(lake.system_uri("backing", lane), storage_options=lake.options):
            continue
        backing = backing_of(lane) if backing_of is not None else BackingQueue(lake, lane)
        for ref in replayed_refs(backing):
            if isinstance(ref, ErrorRef) and ref.queue == name:
                done.setdefault(ref.partition, set()).add(ref.offset)
    return done, accepted


# -- the newest rows --------------------------------------------------------------------------------
def newest_error_rows(lake: Lake, name: str, *, count: int = SAMPLE_ROWS) -> list[dict[str, Any]]:
    """The ``count`` newest rows of the error queue ``name`` (by ``failed_at``, newest first):
    only the last ``count`` offsets of each partition are read."""
    queue = lake.queue(name)
    tables = []
    for part in queue.partitions:
        table, _ = read_present(queue, partition=part, start=0, newest=count, columns=SAMPLE_COLUMNS)
        if table.num_rows:
            tables.append(table)
    rows = [r for t in tables for r in t.to_pylist()]
    rows.sort(key=lambda r: (r["failed_at"], r[PARTITION], r[OFFSET]), reverse=True)
    return rows[:count]


def _cell(text: str, width: int) -> str:
    flat = " ".join(text.split())
    if len(flat) > width:
        flat = flat[: width - 1] + "…"
    return flat.replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")


def _message(exception_type: str, message: str | None) -> str:
    """The message's line that says what failed (for a UDF: the user's line of the worker's
    traceback, not Spark's first line), without the class name the table shows beside it."""
    line = headline(exception_type, message)
    short = exception_type.rsplit(".", 1)[-1] + ": "
    return line[len(short):] if line.startswith(short) else line


def rows_markdown(name: str, rows: Sequence[Mapping[str, Any]], *,
                  replayed: Mapping[str, set[int]] | None = None) -> str:
    """The newest error rows as a markdown table (``cues/newest_rows``)."""
    if not rows:
        return f"Error queue `{name}` has no rows."
    head = ["error row", "processor", "step", "input", "exception", "message", "row"]
    if replayed is not None:
        head.insert(1, "replayed")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        try:
            where = inputs_in_words(r["inputs"])
        except (ValueError, TypeError):  # a damaged row: shown as it is, never a failed observation
            where = str(r["inputs"])
        cells = [f"{name}/{r[PARTITION]}@{r[OFFSET]}", r["processor"], str(r["step"]), where,
                 r["exception_type"], _message(r["exception_type"], r["message"]),
                 r["payload"] if r["payload"] is not None else "-"]
        cells = [_cell(c, PAYLOAD_WIDTH if i == len(cells) - 1 else MESSAGE_WIDTH)
                 for i, c in enumerate(cells)]
        if replayed is not None:
            cells.insert(1, "yes" if r[OFFSET] in replayed.get(r[PARTITION], set()) else "no")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def observe_error_queue(lake: Lake, name: str, *, key: AssetKey, processor: str,
                        rows_from_run: int, graph: Graph | None = None,
                        backing_of: BackingOf | None = None,
                        sample: int = SAMPLE_ROWS) -> AssetObservation:
    """The observation of the error queue ``name`` after ``processor``'s materialization (or a
    replay): see the module docstring. ``graph`` adds the replay counts; ``backing_of`` is how
    the lanes' backing queues are reached (the ``backing`` resource's)."""
    newest = newest_error_rows(lake, name, count=sample)
    done = lanes = None
    if graph is not None:
        done, lanes = replay_log(lake, graph, name, backing_of=backing_of)
    summary = summarize(lake, name, replayed=done, replayable_lanes=lanes)
    metadata: dict[str, Any] = {
        "cues/queue": name, "dagster/row_count": summary.total,
        "cues/by_processor": summary.by_processor,
        "cues/isolated_rows": summary.kinds[ISOLATED],
        "cues/whole_step_rows": summary.kinds[WHOLE_STEP],
        "cues/contract_break_rows": summary.kinds[CONTRACT_BREAK],
        "cues/observed_by": processor, "cues/rows_from_this_run": rows_from_run,
        "cues/newest_rows": MetadataValue.md(rows_markdown(name, newest, replayed=done)),
    }
    if summary.replay is not None:
        metadata["cues/pending_rows"] = summary.replay[PENDING]
        metadata["cues/replayed_rows"] = summary.replay[REPLAYED]
        metadata["cues/not_replayable_rows"] = summary.replay[NOT_REPLAYABLE]
    return AssetObservation(asset_key=key, metadata=metadata)


__all__ = ["CONTRACT_BREAK", "ISOLATED", "NOT_REPLAYABLE", "PENDING", "REPLAYED", "SAMPLE_ROWS",
           "WHOLE_STEP", "ErrorSummary", "error_counts", "error_queue_spec", "error_queue_writers",
           "newest_error_rows", "observe_error_queue", "replay_log", "rows_markdown", "summarize"]
