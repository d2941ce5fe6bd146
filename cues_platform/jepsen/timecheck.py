"""The time nemesis's checks (``--time``), computed by the harness from the lake (``deltalake``),
the nemesis's records (``time.jsonl``) and the runners' event logs:

1. ``retention``: retention really removed rows (the start of ``src_a`` and ``ephemeral`` moved),
   and nothing a reader still needed was removed: the monthly lane delivered every key of its
   input once (``monthly_out``, no policy, holds every visible key no error row took, once, and
   as many rows per partition as ``enriched`` ever held); the lagging tailer read ``merged``
   densely to its end (its violations are the nemesis's); no process log (runners' failed steps,
   feeders, tailers) holds ``OffsetOutOfRangeError``; the expendable tailer's reads plus what
   retention moved it past (``retained_away``) add up to its position. (Every key delivered
   exactly once above the start offsets is the usual checks', ``checker.py``, which never read
   an older table version.)
2. ``footprint``: at the year's end each retained queue's live bytes, and every queue's
   checkpoint bytes, are at most ``FACTOR`` x the largest of months 2-3 (the steady state: 7 days
   of retention behind a monthly reader) plus a fixed allowance; the ``_delta_log`` entries since
   the newest checkpoint at most ``MAX_ENTRIES_SINCE_CHECKPOINT`` and in all at most
   ``MAX_LOG_ENTRIES``. Removed-but-not-vacuumed bytes are reported apart: vacuum judges files by
   the real clock (24 h), which a run of minutes never reaches. The queues without a policy
   (``UNRETAINED``) grow with the keys by design: their live bytes are reported, not bounded.
3. ``timing``: step time (every lane of every runner, the monthly lane's too: the time between a
   lane's consecutive steps while its runner had work, no idle pass between, under
   ``STEP_GAP_MS``: one pass over the lanes with work) and recovery time (every runner start:
   Spark ready -> every lane recovered), bucketed by the platform month they happened in: the
   median of the last two months with samples within ``MAX_RATIO`` of the first two.
4. ``dead_txn``: each transaction whose producer was killed for good was aborted (a decision row
   ``aborted`` in ``_cues/transactions``), none of its keys is visible, and the read_committed
   reader behind it was never stopped there after its deadline (``dl:{txn}``): it waited at most
   its timeout.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from datetime import datetime
from pathlib import Path

from deltalake import DeltaTable

from cues_platform.jepsen import workload as w
from cues_platform.jepsen.lakeread import read_table, start_offset
from cues_platform.jepsen.verdict import CheckResult, Expectation
from cues_platform.queues.layout import DEADLINE, START
from cues_platform.queues.layout import PARTITION as PARTITION_ID

FACTOR = 1.5
LIVE_ALLOWANCE = 256 * 1024  # bytes: a partition's files not yet compacted, row-group overhead
CHECKPOINT_ALLOWANCE = 16 * 1024
MAX_ENTRIES_SINCE_CHECKPOINT = 200  # 2 x delta.checkpointInterval (100)
MAX_LOG_ENTRIES = 300  # log retention (platform clock) keeps the commits from the second-newest checkpoint on
UNRETAINED = (w.ERRORS, w.MONTHLY_OUT, w.TXN_PROGRESS)  # no policy: live bytes and checkpoint grow with the keys
MAX_RATIO = 1.2  # last/first; when the noise between adjacent months is larger, that is the bound (reported)
STEADY_MONTHS = (2, 3)
# timing: the earliest months with samples (no later than FIRST_WITHIN) against the latest (no
# earlier than LAST_FROM; 12: after the year, the drain), each window at least MIN_SAMPLES samples
FIRST_WITHIN = 6
LAST_FROM = 7
MIN_SAMPLES = 3
RESOLUTION_S = 0.001  # the runners' event timestamps are in milliseconds
YEAR_END = 12
MONTH_MS = 365 * 86_400_000 / 12
STEP_GAP_MS = 60_000  # a family step slower than this spans a pause (the monthly runner SIGSTOPped)
MOVED_QUEUES = (w.SRC_IDEM, w.EPHEMERAL)  # fed all year: retention must have moved their start


def _records(expectation: Expectation, event: str) -> list[dict]:
    return [r for r in expectation.time_records if r.get("event") == event]


def _start(root: Path, queue: str, part: str) -> int:
    dt = DeltaTable(str(root / "queues" / queue))
    v = dt.transaction_version(START.id(part))
    return 0 if v is None else int(v)


def _events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"event"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def check_retention(root: Path, expectation: Expectation, delivered: set[str]) -> CheckResult:
    """``delivered``: every visible input key no error row took (what ``enriched`` held, once)."""
    result = CheckResult("retention")
    for queue in MOVED_QUEUES:
        result.checked += 1
        starts = {p: _start(root, queue, p) for p in (w.PARTITIONS if queue != w.EPHEMERAL
                                                       else (w.PROGRESS_PARTITION,))}
        if not any(starts.values()):
            result.fail(f"{queue}: retention never moved a start offset in a year ({starts})")
    # the monthly lane (a registered reader of enriched, one step a month) delivered every key of
    # its input once: monthly_out keeps every row (no policy) and holds as many rows as enriched
    # ever did, partition by partition
    monthly = read_table(root / "queues" / w.MONTHLY_OUT, ["key"])
    got = Counter() if monthly is None else Counter(monthly["key"].to_pylist())
    result.checked += len(delivered)
    for key in sorted(delivered | set(got)):
        if got[key] != (1 if key in delivered else 0):
            result.fail(f"{w.MONTHLY_OUT}: key {key} is there {got[key]} times, expected "
                        f"{1 if key in delivered else 0}: the monthly lane lost or repeated what it needed")
    out_dt, in_dt = DeltaTable(str(root / "queues" / w.MONTHLY_OUT)), DeltaTable(str(root / "queues" / w.ENRICHED))
    for part in w.PARTITIONS:
        result.checked += 1
        n_out, n_in = out_dt.transaction_version(PARTITION_ID.id(part)), in_dt.transaction_version(PARTITION_ID.id(part))
        if start_offset(out_dt, part) or (n_out or 0) != (n_in or 0):
            result.fail(f"{w.MONTHLY_OUT}/{part}: start {start_offset(out_dt, part)}, {n_out} rows; "
                        f"{w.ENRICHED}/{part} held {n_in} (start {start_offset(in_dt, part)})")
    counts = next(iter(_records(expectation, "counts")), None)
    if counts is None:
        result.fail("the time nemesis left no final counts (it did not finish)")
    else:
        for v in counts.get("violations", []):
            result.fail(v)
    lagging = next(iter(_records(expectation, "lagging")), None)
    if lagging is None:
        result.fail("the lagging tailer left no final record")
    else:
        dt = DeltaTable(str(root / "queues" / w.MERGED))
        for part, pos in lagging["position"].items():
            result.checked += 1
            end = dt.transaction_version(PARTITION_ID.id(part))
            if end is not None and int(end) != pos:
                result.fail(f"the lagging tailer ended at {w.MERGED}/{part} {pos}, not at its end {int(end)}")
    expendable = next(iter(_records(expectation, "expendable")), None)
    if expendable is not None:
        result.checked += 1
        total = sum(expendable["retained_away"].values()) + expendable["read"]
        if total != sum(expendable["position"].values()):
            result.fail(f"expendable tailer: read {expendable['read']} + retained away "
                        f"{expendable['retained_away']} != its positions {expendable['position']}")
    if expectation.run_dir is not None:  # every process's log: runners (a failed step), feeders, ...
        for log in sorted((expectation.run_dir / "logs").glob("*.log")):
            result.checked += 1
            text = log.read_text(errors="replace")
            if "OffsetOutOfRangeError" in text:
                line = next(ln for ln in text.splitlines() if "OffsetOutOfRangeError" in ln)
                result.fail(f"{log.name}: a reader met OffsetOutOfRangeError: {line[:300]}")
    return result


def check_footprint(expectation: Expectation, counts: dict) -> CheckResult:
    result = CheckResult("footprint")
    by_month = {r["month"]: r["queues"] for r in _records(expectation, "footprint")}
    end = by_month.get(YEAR_END)
    if end is None:
        result.fail(f"no footprint at the year's end (months sampled: {sorted(map(str, by_month))})")
        return result
    steady = [by_month[m] for m in STEADY_MONTHS if m in by_month]
    if not steady:
        result.fail("no footprint of months 2-3 (the steady state)")
        return result
    for queue, fp in sorted(end.items()):
        if "error" in fp:
            result.fail(f"{queue}: footprint at the year's end failed: {fp['error']}")
            continue
        base = [s[queue] for s in steady if "error" not in s.get(queue, {"error": 1})]
        if not base:
            continue
        bounded = () if queue in UNRETAINED or queue.startswith("_cues/") else (
            ("live_bytes", LIVE_ALLOWANCE), ("checkpoint_bytes", CHECKPOINT_ALLOWANCE))
        counts[f"{queue}.live_bytes"] = fp["live_bytes"]
        counts[f"{queue}.checkpoint_bytes"] = fp["checkpoint_bytes"]
        for what, allowance in bounded:
            result.checked += 1
            bound = FACTOR * max(b[what] for b in base) + allowance
            if what == "checkpoint_bytes":  # + the tombstones added since, at this checkpoint's bytes a row
                added = fp.get("checkpoint_tombstones", 0) - max(b.get("checkpoint_tombstones", 0) for b in base)
                bound += max(0, added) * fp[what] / max(1, fp.get("checkpoint_rows", 1))
            counts[f"{queue}.{what}"] = fp[what]
            counts[f"{queue}.{what}_bound"] = int(bound)
            if fp[what] > bound:
                result.fail(f"{queue}: {what} {fp[what]:,} after a year > bound {bound:,.0f} "
                            f"({FACTOR} x months 2-3's {max(b[what] for b in base):,} + {allowance:,})")
        result.checked += 1
        if fp["entries_since_checkpoint"] > MAX_ENTRIES_SINCE_CHECKPOINT:
            result.fail(f"{queue}: {fp['entries_since_checkpoint']} _delta_log entries since the newest "
                        f"checkpoint > {MAX_ENTRIES_SINCE_CHECKPOINT}")
        result.checked += 1
        if fp["log_entries"] > MAX_LOG_ENTRIES:
            result.fail(f"{queue}: {fp['log_entries']} _delta_log entries after a year > {MAX_LOG_ENTRIES}")
        counts[f"{queue}.removed_bytes"] = fp["removed_bytes"]
        counts[f"{queue}.log_entries"] = fp["log_entries"]
        counts[f"{queue}.entries_since_checkpoint"] = fp["entries_since_checkpoint"]
        counts[f"{queue}.checkpoint_app_transactions"] = fp.get("checkpoint_app_transactions")
        counts[f"{queue}.checkpoint_tombstones"] = fp.get("checkpoint_tombstones")
    return result


def _ts_ms(event: dict) -> int:
    return int(datetime.fromisoformat(event["ts"]).timestamp() * 1000)


def timing_samples(expectation: Expectation) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """(recovery seconds by month, step seconds by month) from the runners' event logs: a lane's
    recovery (the time to its ``recovered`` event from Spark ready or the lane recovered before
    it; every runner, the monthly lane's too: the same work per lane) and a family's step in a
    busy pass (below; the graph's runners only, ``runner-*``, so the mix of families compares
    like with like). The month is the platform month the sample ended in; after
    the year (the drain, on a lake with a year behind it) is month 12; the registration, before
    the clock ran, on an empty lake, is left out."""
    start = next(iter(_records(expectation, "clock_start")), None)
    recovery: dict[int, list[float]] = {}
    steps: dict[int, list[float]] = {}
    if start is None or expectation.run_dir is None:
        return recovery, steps
    real0, rate, year_s = start["real0_ms"], start["rate"], start["year_seconds"]

    def month(real_ms: int) -> int | None:
        elapsed = (real_ms - real0) / 1000
        if elapsed < 0:
            return None  # the registration, before the clock ran (an empty lake: no baseline)
        if elapsed >= year_s:
            return YEAR_END
        return min(YEAR_END - 1, int(elapsed * rate * 1000 // MONTH_MS))

    def add(samples: dict[int, list[float]], at: int, seconds: float) -> None:
        m = month(at)
        if m is not None:
            samples.setdefault(m, []).append(seconds)

    logs = expectation.run_dir / "logs"
    for log in sorted([*logs.glob("runner-*.log"), *logs.glob("monthly-*.log")]):
        graph = log.name.startswith("runner-")
        ready: int | None = None
        # step time: one family's step (its lanes side by side, or a sink's lanes in turn),
        # from the end of the previous family's step in the same busy pass to the end of its own
        chain: int | None = None  # end of the previous family step of a busy pass (None: reset)
        group: dict | None = None  # the family step being read: family, lanes, before, end

        def flush(graph: bool = graph) -> None:
            nonlocal chain, group
            if group is not None:
                if graph and group["before"] is not None and group["end"] - group["before"] < STEP_GAP_MS:
                    add(steps, group["end"], (group["end"] - group["before"]) / 1000)
                chain, group = group["end"], None

        for e in _events(log):
            kind = e.get("event")
            if kind == "step":
                lane, at = e.get("processor", ""), _ts_ms(e)
                family = w.lane_family(lane)
                if group is not None and group["family"] == family and lane not in group["lanes"]:
                    group["lanes"].add(lane)
                    group["end"] = at
                else:
                    flush()
                    group = {"family": family, "lanes": {lane}, "before": chain, "end": at}
                continue
            flush()
            chain = None  # anything but a step (recovered, idle, a restart) ends the busy pass
            if kind == "started":
                ready = None
            elif kind == "spark_ready":
                ready = _ts_ms(e)
            elif kind == "recovered" and ready is not None:
                # a lane's recovery (fence, roll forward): from Spark ready or the previous lane's
                at = _ts_ms(e)
                add(recovery, at, (at - ready) / 1000)
                ready = at
        flush()
    return recovery, steps


def adjacent_noise(samples: dict[int, list[float]]) -> float:
    """The largest ratio between the medians of two adjacent months of the year (each with at
    least MIN_SAMPLES samples): one month of state apart, their difference is the machine's noise
    (1.0 when no two adjacent months have samples)."""
    medians = {m: statistics.median(v) for m, v in samples.items() if m < YEAR_END and len(v) >= MIN_SAMPLES}
    ratios = [max(medians[m], medians[m + 1]) / min(medians[m], medians[m + 1])
              for m in medians if m + 1 in medians and min(medians[m], medians[m + 1]) > 0]
    return max(ratios, default=1.0)


def _window(samples: dict[int, list[float]], months: range) -> list[int]:
    """The months of ``months``, in that order, that have samples, until MIN_SAMPLES are in."""
    out, n = [], 0
    for m in months:
        if n >= MIN_SAMPLES:
            break
        if samples.get(m):
            out.append(m)
            n += len(samples[m])
    return sorted(out)


def check_timing(expectation: Expectation, counts: dict) -> CheckResult:
    result = CheckResult("timing")
    recovery, steps = timing_samples(expectation)
    for what, samples in (("recovery", recovery), ("step", steps)):
        first_months = _window(samples, range(0, FIRST_WITHIN + 1))
        last_months = _window(samples, range(YEAR_END, LAST_FROM - 1, -1))
        first = [x for m in first_months for x in samples[m]]
        last = [x for m in last_months for x in samples[m]]
        result.checked += sum(len(v) for v in samples.values())
        counts[f"{what}_samples_by_month"] = ", ".join(f"{m}:{len(v)}" for m, v in sorted(samples.items()))
        if len(first) < MIN_SAMPLES or len(last) < MIN_SAMPLES:
            result.fail(f"{what} time: too few samples to compare the year's start (months 0-{FIRST_WITHIN}: "
                        f"{len(first)}) with its end (months {LAST_FROM}-{YEAR_END}: {len(last)}); at least "
                        f"{MIN_SAMPLES} each")
            continue
        a, b = statistics.median(first), statistics.median(last)
        noise = adjacent_noise(samples)
        bound = max(MAX_RATIO, noise)
        counts[f"{what}_first_months"] = str(first_months)
        counts[f"{what}_last_months"] = str(last_months)
        counts[f"{what}_first_median_ms"] = round(a * 1000, 1)
        counts[f"{what}_last_median_ms"] = round(b * 1000, 1)
        counts[f"{what}_last_over_first_pct"] = round(100 * b / a) if a else None
        counts[f"{what}_adjacent_month_noise_pct"] = round(100 * noise)
        counts[f"{what}_within_1_2"] = b <= MAX_RATIO * a
        # event timestamps have millisecond resolution: a median may be off by RESOLUTION_S
        if b - RESOLUTION_S > bound * (a + RESOLUTION_S):
            result.fail(f"{what} time in months {last_months}: median {b * 1000:.1f} ms ({len(last)} samples) "
                        f"> {bound:.2f} x months {first_months}' {a * 1000:.1f} ms ({len(first)} samples) "
                        f"(bound: {MAX_RATIO}, or the noise between adjacent months {noise:.2f} if larger; "
                        f"each median +/- {RESOLUTION_S * 1000:g} ms, the events' resolution)")
    return result


def check_dead(root: Path, expectation: Expectation, counts: dict) -> CheckResult:
    result = CheckResult("dead_txn")
    dead = _records(expectation, "dead_txn")
    if not dead:
        result.fail("no transaction was killed for good")
        return result
    coordinator = root / "_cues" / "transactions"
    dt = DeltaTable(str(coordinator))
    rows = read_table(coordinator, ["txn_id", "action"])
    actions: dict[str, set[str]] = {}
    for txn, action in zip(rows["txn_id"].to_pylist(), rows["action"].to_pylist(), strict=True):
        actions.setdefault(txn, set()).add(action)
    watch = next(iter(_records(expectation, "watch")), {"dead": {}})["dead"]
    waits = []
    for d in dead:
        result.checked += 1
        txn = d["txn"]
        if "aborted" not in actions.get(txn, set()) or "committed" in actions.get(txn, set()):
            result.fail(f"dead transaction {txn}: decisions {sorted(actions.get(txn, set()))}, "
                        "expected one 'aborted' (its timeout)")
        deadline = dt.transaction_version(DEADLINE.id(txn))
        seen = watch.get(str(d["index"]))
        if deadline is None or seen is None:
            result.fail(f"dead transaction {txn}: deadline {deadline}, watched {seen is not None}")
            continue
        if seen["passed_ms"] is None:
            result.fail(f"dead transaction {txn}: the read_committed reader never passed it")
        if seen["last_stall_ms"] is not None and seen["last_stall_ms"] > int(deadline):
            result.fail(f"dead transaction {txn}: the reader was still stopped at it "
                        f"{(seen['last_stall_ms'] - int(deadline)) / 1000:.0f} s (platform) past its "
                        f"deadline (timeout {d['timeout_ms'] / 1000:.0f} s)")
        if seen["first_stall_ms"] is not None and seen["passed_ms"] is not None:
            waits.append((seen["passed_ms"] - seen["first_stall_ms"]) / d["timeout_ms"])
    if waits:
        counts["dead_txn_wait_max_of_timeout_pct"] = round(100 * max(waits))
    return result


def check_time(root: Path, expectation: Expectation, delivered: set[str], counts: dict) -> list[CheckResult]:
    return [check_retention(root, expectation, delivered), check_footprint(expectation, counts),
            check_timing(expectation, counts), check_dead(root, expectation, counts)]
