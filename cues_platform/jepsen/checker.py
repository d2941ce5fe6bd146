"""The independent checker: reads the lake's Delta tables with ``deltalake`` and pyarrow only.

It never uses the platform's reader, tailers or auditor: the layout (``{root}/queues/{name}``,
``{root}/_cues/transactions``, ``{root}/_cues/backing/{processor}``), the metadata columns and the
read_committed rule are re-implemented here from their documented meaning, so a bug in the
platform's reading code cannot hide a bug in its writing code.

read_committed, independently: a row whose ``_txn_id`` is null is visible; a row of a transaction
is visible iff the coordinator table holds a decision row (``action == "committed"``) for its
``txn_id``. A transaction with no decision (open, or never opened) is not visible; one with both
decisions, or whose queue marker (the app transaction ``txn:{id}``: 1 committed, 2 aborted)
disagrees with the coordinator, is a violation.

Every key queue has two partitions and every processor runs as two lanes (``validate`` reads
and writes partition "0", ``validate.1`` partition "1"; :mod:`~cues_platform.jepsen.workload`
states the naming rule): offsets are keyed by (partition, offset), and a processor named in a
row (an error row's ``processor``, a sink row's lane) is any lane of it.

Checks (each PASS/FAIL with examples):

1. ``dense_offsets``: every queue (and backing queue, one per lane) holds exactly the offsets
   ``[start, n)`` per partition (start: ``start:{partition}``, where retention moved it; 0
   otherwise), no gap, no duplicate, and its ``part:{partition}`` app transaction (when present)
   says n. The checker never reads an older table version: rows below a start are proven by
   what a deployment keeps (``Expectation.offsets``: where each acknowledged batch landed;
   ``Expectation.merged_read``: what the lagging, non-expendable tailer read of ``merged``).
2. ``read_committed``: decisions are consistent; no key of an aborted transaction is visible,
   and no invisible key reached any processor's output or the sink.
3. ``acknowledged``: every acknowledged key at or above its partition's start is at the offset
   its send returned; below it (retained away) it is in ``merged`` (every reader had read it);
   every visible input key left is there once and is a key of the plan.
4. ``exactly_once``: every visible input key is in ``merged`` once; then either exactly once in
   each downstream queue and the sink table, or (rejected by the user's rule, isolated from its
   batch) in exactly one error row and nowhere downstream; never both, never missing.
5. ``error_rows``: every error row was written by a lane of the rejecting processor with the
   user's exception, for an input range that holds a key the user's rule rejects and no key it
   accepts (isolation, ``processing/isolation.py``: the rest of the batch is delivered).
6. ``sink_once``: the sink table's rows each carry a delivery hash and no key twice (the counts
   are part of check 4).
7. ``lanes``: every key is in the partition its feeder sent it to, in every key queue (so each
   lane read and wrote its own partition); every sink row was applied by the ``store`` lane of
   that partition; every error row's input ranges are in the partition of the lane that wrote
   it.
8. ``redeploy``: no graph change changed the meaning silently. Every incompatible version the
   redeploy nemesis started was refused with the expected RedeployError subclass, and no
   compatible one was refused (but for a step in flight, which defers it); every version of the
   registry ``_cues/deployments`` (read version by version) holds only shapes of the compatible
   versions (a lane of the workload, exactly_once, its home and the queue partitions it reads);
   no backing queue of any other processor id exists, and the incompatible version's own queue
   ``enriched_v2`` holds no row: nothing ran under an incompatible version.

With ``--time``, the time nemesis's checks follow (``timecheck.py``). Floors: ``verdict`` (what
the checker knows, its verdicts) and ``lakeread`` (raw reads of the lake) at the bottom;
``timecheck`` on them; this module, which runs every check, on top.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from cues_platform.jepsen import lakeread as lr
from cues_platform.jepsen import workload as w
from cues_platform.jepsen.lakeread import footprint, key_queue, open_table, read_table, start_offset
from cues_platform.jepsen.timecheck import check_time
from cues_platform.jepsen.verdict import CheckReport, CheckResult, Expectation, format_checks
from cues_platform.queues.layout import PARTITION as PARTITION_ID
from cues_platform.queues.layout import TXN_MARKER

COMMITTED, ABORTED = 1, 2
__all__ = ["CheckReport", "CheckResult", "Expectation", "check_lake", "footprint", "format_checks",
           "start_offset"]


def decisions(root: Path, result: CheckResult) -> dict[str, int]:
    """txn id -> COMMITTED | ABORTED from the coordinator's rows (both: a violation)."""
    table = read_table(root / "_cues" / "transactions", ["txn_id", "action"])
    out: dict[str, int] = {}
    if table is None:
        return out
    seen: dict[str, set[str]] = {}
    for txn, action in zip(table["txn_id"].to_pylist(), table["action"].to_pylist(), strict=True):
        if action in ("committed", "aborted"):
            seen.setdefault(txn, set()).add(action)
    for txn, actions in seen.items():
        result.checked += 1
        if len(actions) > 1:
            result.fail(f"transaction {txn} was decided both committed and aborted")
        out[txn] = COMMITTED if "committed" in actions else ABORTED
    return out


def visible_keys(root: Path, queue: str, decided: dict[str, int],
                 result: CheckResult) -> tuple[dict[tuple[str, int], str], list[str]]:
    """({(partition, offset): key} of the visible rows, hidden keys) of an input queue under
    read_committed (what is left of it above its start offsets), checking each transaction's
    queue marker against the coordinator."""
    path = key_queue(root, queue)
    dt = open_table(path)
    if dt is None:
        return {}, []
    table = read_table(path, ["key", "_txn_id", "_partition", "_offset"])
    txns = table["_txn_id"].to_pylist() if "_txn_id" in table.column_names else [None] * table.num_rows
    for txn in sorted({t for t in txns if t is not None}):
        marker = dt.transaction_version(TXN_MARKER.id(txn))
        if marker is not None and int(marker) in (COMMITTED, ABORTED) and int(marker) != decided.get(txn):
            result.fail(f"queue {queue}: marker of transaction {txn} says {int(marker)} but the "
                        f"coordinator says {decided.get(txn, 'undecided')}")
    visible: dict[tuple[str, int], str] = {}
    hidden: list[str] = []
    where = zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True)
    for key, txn, at in zip(table["key"].to_pylist(), txns, where, strict=True):
        if txn is None or decided.get(txn) == COMMITTED:
            visible[at] = key
        else:
            hidden.append(key)
    return visible, hidden


# -- the checks ------------------------------------------------------------------------------------
def check_dense_offsets(root: Path, expectation: Expectation) -> CheckResult:
    """Every partition holds exactly the offsets ``[start, next)`` (start: ``start:{p}``, 0 when
    absent; next: ``part:{p}``), no gap, no duplicate. Rows of ``merged`` below its start must
    have been read by the lagging tailer (``Expectation.merged_read``), which proves them."""
    result = CheckResult("dense_offsets")
    for path in [*lr.tables_under(root / "queues"), *lr.tables_under(root / "_cues" / "backing")]:
        table = read_table(path, ["_partition", "_offset"])
        if table is None or "_offset" not in table.column_names:
            continue
        dt = open_table(path)
        by_part: dict[str, list[int]] = {}
        for part, off in zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True):
            by_part.setdefault(part, []).append(off)
        parts = set(by_part) | {p for p in w.PARTITIONS if dt.transaction_version(PARTITION_ID.id(p)) is not None}
        for part in sorted(parts):
            offsets = by_part.get(part, [])
            result.checked += 1
            where = f"{path.parent.name}/{path.name} partition {part!r}"
            first = start_offset(dt, part)
            declared = dt.transaction_version(PARTITION_ID.id(part))
            counts = Counter(offsets)
            end = first + len(counts)
            dups = sorted(o for o, c in counts.items() if c > 1)
            missing = sorted(set(range(first, end)) - set(counts))
            beyond = sorted(o for o in counts if o >= end or o < first)
            if dups:
                result.fail(f"{where}: duplicate offsets {dups[:5]} ({len(dups)} in all)")
            if missing or beyond:
                result.fail(f"{where}: offsets are not {first}..{end - 1}" + (f" (start {first})" if first else "")
                            + f": missing {missing[:5]}, out of range {beyond[:5]}")
            if declared is not None and int(declared) != (max(counts) + 1 if counts else first):
                result.fail(f"{where}: the log says next offset {int(declared)} but the files hold "
                            + (f"offsets up to {max(counts)}" if counts else f"no row from start {first}"))
            if first and path.parent.name == "queues" and path.name == w.MERGED:
                read = {o for p, o, _ in expectation.merged_read if p == part}
                unproven = sorted(set(range(first)) - read)
                if unproven:
                    result.fail(f"{where}: retention removed offsets below {first} that the lagging "
                                f"tailer never read: {unproven[:5]} ({len(unproven)} in all)")
    return result


def merged_history(root: Path, expectation: Expectation, result: CheckResult) -> pa.Table | None:
    """Every row ``merged`` ever held (key, partition, offset): what is left, plus what the lagging
    tailer read below it (a row read twice, or read with another key than the one still there, is
    a violation)."""
    table = read_table(key_queue(root, w.MERGED), ["key", "_partition", "_offset"])
    if table is None or not expectation.merged_read:
        return table
    seen: dict[tuple[str, int], str] = dict(zip(
        zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True),
        table["key"].to_pylist(), strict=True))
    extra: dict[tuple[str, int], str] = {}
    for part, off, key in expectation.merged_read:
        result.checked += 1
        had = seen.get((part, off), extra.get((part, off)))
        if had is not None and had != key:
            result.fail(f"merged partition {part!r} offset {off}: the lagging tailer read key {key}, "
                        f"the queue holds (or it read before) {had}")
        elif had is None:
            extra[(part, off)] = key
    if not extra:
        return table
    more = pa.table({"key": pa.array([k for k in extra.values()], pa.string()),
                     "_partition": pa.array([p for p, _ in extra], pa.string()),
                     "_offset": pa.array([o for _, o in extra], pa.int64())})
    return pa.concat_tables([more, table.select(["key", "_partition", "_offset"]).cast(more.schema)])


def check_lanes(root: Path, expectation: Expectation, sink: pa.Table | None,
                error_rows: list[dict]) -> CheckResult:
    """Check 7: keys stay in their feeder's partition through every lane."""
    result = CheckResult("lanes")
    for queue in w.KEY_QUEUES:
        table = read_table(key_queue(root, queue), ["key", "_partition", "_offset"])
        if table is None:
            continue
        for key, part, off in zip(table["key"].to_pylist(), table["_partition"].to_pylist(),
                                  table["_offset"].to_pylist(), strict=True):
            result.checked += 1
            want = expectation.partition_of.get(key)
            if want is not None and part != want:  # a key of no plan: check 3 names it
                result.fail(f"{queue}: key {key} is in partition {part!r} (offset {off}) but its "
                            f"feeder sent it to partition {want!r}")
    if sink is not None:
        lanes = (sink[w.SINK_LANE_COLUMN].to_pylist() if w.SINK_LANE_COLUMN in sink.column_names
                 else [None] * sink.num_rows)
        for key, lane in zip(sink["key"].to_pylist(), lanes, strict=True):
            result.checked += 1
            want = expectation.partition_of.get(key)
            if not lane:
                result.fail(f"sink row of key {key} names no lane (column {w.SINK_LANE_COLUMN!r})")
            elif want is not None and lane != w.lane_id(w.SINK_PROCESSOR, want):
                result.fail(f"sink row of key {key} was applied by {lane!r}, not by the "
                            f"{w.SINK_PROCESSOR} lane of its partition {want!r} "
                            f"({w.lane_id(w.SINK_PROCESSOR, want)!r})")
    for row in error_rows:
        lane, mine = row["processor"], w.lane_partition(row["processor"])
        for binding, (queue, part, start, end) in json.loads(row["inputs"]).items():
            result.checked += 1
            if part != mine:
                result.fail(f"error row at offset {row.get('_offset')} of lane {lane!r} (partition "
                            f"{mine!r}): input {binding!r} covers {queue} partition {part!r} "
                            f"[{start}, {end})")
    return result


# What each declared processor reads and where it keeps its steps (its first output), restated
# from the workload's topology: a registry row of a lane must say exactly this.
_READS = {"merge": (w.SRC_IDEM, w.SRC_TXN), "validate": (w.MERGED,), "split": (w.VALIDATED,),
          "enrich": (w.LEFT,), "store": (w.RIGHT,)}
_HOMES = {"merge": w.MERGED, "validate": w.VALIDATED, "split": w.LEFT, "enrich": w.ENRICHED, "store": None}


def _registry_versions(path: Path) -> list[tuple[int, pa.Table]]:
    dt = open_table(path)
    if dt is None:
        return []
    return [(v, DeltaTable(str(path), version=v).to_pyarrow_table()) for v in range(dt.version() + 1)]


def _shape_problem(row: dict) -> str | None:
    """Why a registry row is no shape of a compatible version (None: it is one)."""
    lane, graphs = row["processor"], {v.graph_name for v in w.COMPATIBLE}
    if lane in w.MONTHLY_LANES and row["graph"] == w.MONTHLY_GRAPH:  # the time nemesis's lane
        reads = {(q, p) for _, q, p in json.loads(row["inputs"])}
        part = w.lane_partition(lane)
        if row["home"] != w.MONTHLY_OUT or reads != {(w.ENRICHED, part)} or row["strategy"] != "exactly_once":
            return f"monthly lane: home {row['home']!r}, reads {sorted(reads)}, {row['strategy']}"
        return None
    if row["graph"] not in graphs:
        return f"recorded by graph {row['graph']!r}, which is not a compatible version"
    if lane not in w.LANES:
        return "a processor id no compatible version has"
    family, part = w.lane_family(lane), w.lane_partition(lane)
    if row["strategy"] != "exactly_once":
        return f"strategy {row['strategy']!r}"
    if row["home"] != _HOMES[family]:
        return f"home {row['home']!r} (its first output is {_HOMES[family]!r})"
    reads = {(q, p) for _, q, p in json.loads(row["inputs"])}
    allowed = {(q, part) for q in _READS[family]}
    if reads != allowed and not (family == "merge" and reads == allowed | {(w.SPARE, part)}):
        return f"reads {sorted(reads)} (a lane of partition {part!r} reads {sorted(allowed)})"
    return None


def check_redeploy(root: Path, expectation: Expectation) -> CheckResult:
    """Check 8: every incompatible version refused, nothing recorded or run under one."""
    result = CheckResult("redeploy")
    for record in expectation.redeploys:
        if record.get("event") == "incompatible":
            result.checked += 1
            if record.get("outcome") != "refused" or record.get("error_type") != record.get("expected"):
                result.fail(f"silent change of meaning: {record.get('runner')} started incompatible "
                            f"version {record.get('variant')!r} and it was not refused with "
                            f"{record.get('expected')} ({record.get('decision')}, exit {record.get('rc')}, "
                            f"{record.get('error_type')}: {str(record.get('error'))[:200]})")
        elif record.get("event") == "compatible_refused":
            result.checked += 1
            result.fail(f"compatible version {record.get('variant')!r} was refused by "
                        f"{record.get('runner')} with {record.get('error_type')}: "
                        f"{str(record.get('error'))[:200]}")
    seen: set[tuple] = set()
    for version, table in _registry_versions(root / "_cues" / "deployments"):
        for row in table.to_pylist():
            key = (row["processor"], row["graph"], row["strategy"], row["home"], row["inputs"])
            if key in seen:
                continue
            seen.add(key)
            result.checked += 1
            problem = _shape_problem(row)
            if problem:
                result.fail(f"_cues/deployments version {version}: processor {row['processor']!r}: "
                            f"{problem}: a start under an incompatible version was recorded, not refused")
    backing = root / "_cues" / "backing"
    for folder in sorted(backing.iterdir()) if backing.is_dir() else []:
        result.checked += 1
        if folder.name not in w.LANES and folder.name not in w.MONTHLY_LANES:
            result.fail(f"backing queue {folder.name!r}: a processor id no compatible version has "
                        f"(something ran under an incompatible version)")
    stray = read_table(key_queue(root, w.ENRICHED_V2), ["key"])
    if stray is not None:
        result.checked += 1
        if stray.num_rows:
            result.fail(f"queue {w.ENRICHED_V2!r} (the home of incompatible version home_enrich) holds "
                        f"{stray.num_rows} row(s): steps ran under an incompatible version")
    return result


@dataclass
class _Inputs:
    """The input queues read_committed: what is left of them above their start offsets."""

    decided: dict[str, int]  # txn id -> COMMITTED | ABORTED
    present: dict[str, dict[tuple[str, int], str]]  # queue -> {(partition, offset): key} visible
    hidden: list[str]  # keys of rows not visible
    starts: dict[tuple[str, str], int]  # (queue, partition) -> start offset
    in_bag: Counter[str]  # visible key -> how many times


def _read_inputs(root: Path, rc: CheckResult) -> _Inputs:
    decided = decisions(root, rc)
    present: dict[str, dict[tuple[str, int], str]] = {}
    hidden: list[str] = []
    starts: dict[tuple[str, str], int] = {}
    for queue in (w.SRC_IDEM, w.SRC_TXN):
        present[queue], h = visible_keys(root, queue, decided, rc)
        hidden += h
        dt = open_table(key_queue(root, queue))
        for p in w.PARTITIONS:
            starts[(queue, p)] = 0 if dt is None else start_offset(dt, p)
    in_bag = Counter(k for rows in present.values() for k in rows.values())
    return _Inputs(decided, present, hidden, starts, in_bag)


def _check_acknowledged(expectation: Expectation, inputs: _Inputs,
                        merged_bag: Counter[str]) -> tuple[CheckResult, int]:
    """Check 3: above its partition's start an acknowledged key is where its send put it; below
    it, retention removed it, which is right only if every reader had read it (merged has it).
    Returns the check and how many acknowledged keys were retained away."""
    in_bag = inputs.in_bag
    ack = CheckResult("acknowledged", checked=len(expectation.acked) + len(in_bag))
    retained_acked = 0
    for key in sorted(expectation.acked):
        where = expectation.offsets.get(key)
        if where is None:
            if key not in in_bag and key not in merged_bag:
                ack.fail(f"acknowledged key {key} is not visible in the inputs nor in merged (lost)")
            continue
        queue, part, off = where
        start = inputs.starts.get((queue, part), 0)
        if off >= start:
            got = inputs.present[queue].get((part, off))
            if got != key:
                ack.fail(f"acknowledged key {key} (sent to {queue}/{part} offset {off}, at or above the "
                         f"start {start}) is not there (found {got!r}): lost")
        else:
            retained_acked += 1
            if key not in merged_bag:
                ack.fail(f"acknowledged key {key} at {queue}/{part} offset {off} was retained away "
                         f"(start {start}) before merge read it: not in merged")
    for key, n in sorted(in_bag.items()):
        if n > 1:
            ack.fail(f"input key {key} is visible {n} times")
        if key not in expectation.known_keys:
            ack.fail(f"input key {key} is not a key of the plan")
    return ack, retained_acked


def _downstream(root: Path, expectation: Expectation, merged_bag: Counter[str],
                sink: pa.Table | None) -> dict[str, Counter[str]]:
    """Every key of each output (merged's whole history, the sink, monthly_out under --time)."""
    downstream = {q: lr.bag(root, q) for q in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED)}
    downstream[w.MERGED] = merged_bag
    downstream["sink"] = Counter() if sink is None else Counter(sink["key"].to_pylist())
    if expectation.time_records:
        downstream[w.MONTHLY_OUT] = lr.bag(root, w.MONTHLY_OUT)
    return downstream


def _check_nothing_invisible(rc: CheckResult, expectation: Expectation, inputs: _Inputs,
                             visible_set: set[str], downstream: dict[str, Counter[str]]) -> None:
    """Check 2, on the keys: none of an aborted transaction is visible, none invisible was
    processed."""
    for key in sorted(visible_set & expectation.aborted_keys):
        rc.fail(f"key {key} of a transaction the feeder aborted is visible read_committed")
    invisible = (set(inputs.hidden) | set(expectation.aborted_keys)) - visible_set
    for where, bag in downstream.items():
        rc.checked += len(bag)
        for key in sorted(set(bag) & invisible):
            rc.fail(f"{where}: key {key} of an aborted/undecided transaction was processed")


def _check_error_rows(root: Path, expectation: Expectation, merged: pa.Table | None,
                      error_rows: list[dict]) -> tuple[CheckResult, Counter[str], dict[str, str]]:
    """Check 5; returns it, the keys rejected legitimately with their batch, and each key whose
    batch an illegitimate error row swallowed (-> that row)."""
    err = CheckResult("error_rows")
    at = {q: lr.keys_by_offset(root, q) for q in (w.SRC_IDEM, w.SRC_TXN, w.VALIDATED, w.LEFT, w.RIGHT)}
    at[w.MERGED] = lr.keys_by_offset(root, w.MERGED, merged)
    covered: Counter[str] = Counter()  # keys rejected legitimately, with their batch
    lost_to: dict[str, str] = {}  # key -> the illegitimate error row that swallowed its batch
    for row in error_rows:
        err.checked += 1
        what = (f"error row at offset {row.get('_offset')} ({row['processor']} step {row['step']}, "
                f"{row['exception_type']})")
        keys: list[str] = []
        for spec in json.loads(row["inputs"]).values():
            queue, part, start, end = spec
            rows_at = at.get(queue, {})
            keys += [rows_at[(part, o)] for o in range(start, end) if (part, o) in rows_at]
        legit = row["processor"] in w.LANES and w.lane_family(row["processor"]) == w.REJECTING_PROCESSOR \
            and row["exception_type"].endswith("." + w.REJECTED_EXCEPTION)
        if not legit:
            err.fail(f"{what}: not a rejection by the user's function; its batch of {len(keys)} "
                     f"key(s) is lost: {keys[:3]}")
            for key in keys:
                lost_to.setdefault(key, what)
            continue
        if not any(expectation.is_rejected(k) for k in keys):
            err.fail(f"{what}: its input range holds no key the user's rule rejects ({len(keys)} keys)")
        accepted = [k for k in keys if not expectation.is_rejected(k)]
        if accepted and expectation.isolated:  # isolation names only the rows the function fails on
            err.fail(f"{what}: it holds {len(accepted)} key(s) the user's rule accepts, which "
                     f"isolation should have delivered: {accepted[:3]}")
        covered.update(keys)
    return err, covered, lost_to


def _check_exactly_once(root: Path, once: CheckResult, expectation: Expectation,
                        visible_set: set[str], downstream: dict[str, Counter[str]],
                        covered: Counter[str], lost_to: dict[str, str]) -> set[str]:
    """Check 4: merged (whole history) and the outputs nobody retains (the sink, monthly_out
    under --time) exactly; a queue retention moved, in what is left of it: at most once. Returns
    the keys in an error row."""
    merged_bag = downstream[w.MERGED]
    once.checked += len(visible_set)
    for key in sorted(visible_set | set(merged_bag)):
        n = merged_bag[key]
        if n != 1:
            why = f" (its batch went to the {lost_to[key]})" if key in lost_to else ""
            once.fail(f"merged: key {key} is there {n} times (expected once){why}")
        if key not in visible_set and key not in expectation.aborted_keys:  # aborted: read_committed's
            once.fail(f"merged: key {key} is no visible input key of the plan")
    errored = {k for k, n in covered.items() if n}
    for key, n in sorted(covered.items()):
        if n > 1:
            once.fail(f"errors: key {key} is in {n} error rows (expected one)")
    exact = [where for where in downstream if where != w.MERGED]
    for where in exact:
        bag = downstream[where]
        partial = where in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED) and lr.retained(root, where)
        for key in sorted(visible_set | set(bag)):
            n, expected = bag[key], 0 if key in errored else 1
            if n == expected or (partial and n == 0):
                if key not in visible_set and key not in expectation.aborted_keys and n:
                    once.fail(f"{where}: key {key} is no visible input key of the plan")
                continue
            if key in errored:
                once.fail(f"{where}: key {key} is both in an error row and delivered ({n}x)")
            elif n == 0:
                why = f" (its batch went to the {lost_to[key]})" if key in lost_to else ""
                once.fail(f"{where}: key {key} is missing{why}")
            else:
                once.fail(f"{where}: key {key} is there {n} times")
    for key in sorted(visible_set):
        if expectation.is_rejected(key) and key not in errored:
            once.fail(f"key {key} is rejected by the user's rule but in no error row")
    return errored


def _check_sink(sink: pa.Table | None, sink_bag: Counter[str]) -> CheckResult:
    """Check 6: every sink row carries a delivery hash, no effect is applied twice."""
    sink_check = CheckResult("sink_once")
    if sink is not None:
        sink_check.checked = sink.num_rows
        hashes = sink["hash"].to_pylist() if "hash" in sink.column_names else [None] * sink.num_rows
        for key, h in zip(sink["key"].to_pylist(), hashes, strict=True):
            if not h:
                sink_check.fail(f"sink row of key {key} carries no delivery hash")
        for key, n in sorted(sink_bag.items()):
            if n > 1:
                sink_check.fail(f"sink effect of key {key} applied {n} times")
    return sink_check


def check_lake(root: str | Path, expectation: Expectation) -> CheckReport:
    """Run every check on the lake at ``root`` (a local folder)."""
    root = Path(root)
    rc = CheckResult("read_committed")
    inputs = _read_inputs(root, rc)
    once = CheckResult("exactly_once")
    merged = merged_history(root, expectation, once)
    merged_bag = Counter() if merged is None else Counter(merged["key"].to_pylist())
    ack, retained_acked = _check_acknowledged(expectation, inputs, merged_bag)
    visible_set = set(inputs.in_bag) | {k for k in merged_bag if k in expectation.known_keys}
    sink = lr.sink_table(root)
    downstream = _downstream(root, expectation, merged_bag, sink)
    _check_nothing_invisible(rc, expectation, inputs, visible_set, downstream)
    error_rows = lr.error_rows(root)
    err, covered, lost_to = _check_error_rows(root, expectation, merged, error_rows)
    errored = _check_exactly_once(root, once, expectation, visible_set, downstream, covered, lost_to)
    sink_check = _check_sink(sink, downstream["sink"])
    counts = {"acked_keys": len(expectation.acked), "visible_input_keys": len(visible_set),
              "input_keys_left": len(inputs.in_bag), "acked_keys_retained_away": retained_acked,
              "merged_rows_proven_by_the_lagging_tailer": sum(merged_bag.values()) - sum(lr.bag(root, w.MERGED).values()),
              "hidden_input_rows": len(inputs.hidden), "transactions_decided": len(inputs.decided),
              "error_rows": err.checked, "keys_in_error_rows": len(errored),
              "enriched_rows": sum(downstream[w.ENRICHED].values()),
              "sink_rows": 0 if sink is None else sink.num_rows}
    lanes = check_lanes(root, expectation, sink, error_rows)
    checks = [check_dense_offsets(root, expectation), rc, ack, once, err, sink_check, lanes,
              check_redeploy(root, expectation)]
    if expectation.time_records:
        checks += check_time(root, expectation, visible_set - errored, counts)
    return CheckReport(checks=checks, counts=counts)
