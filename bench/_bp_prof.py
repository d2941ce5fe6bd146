"""Postings protocol end to end: postings/s and posting → result latency with 3 producers × 3
instances and 2 consumers (one active instance each, reading POSTINGS as Arrow: no Spark), on
this machine.

Run: ``.venv/bin/python bench/bench_participants.py [--postings 10000] [--paced-postings 3000]
[--rate 300]`` (writes ``bench/results/participants.json``; see ``docs/benchmarks-postings.md``).
Re-measure after a change: ``.venv/bin/python bench/bench_participants.py --postings 10000
--paced-postings 1500 --rate 300`` prints, last, one line with the paced p99 and burst postings/s
next to those of the committed ``bench/results/participants.json`` (``--baseline FILE`` to
compare with another file).
A quick check that it runs (numbers meaningless): ``--quick`` (= ``--postings 300 --paced-postings
150 --rate 100``, written to /tmp/participants-quick.json unless ``--out`` is given).
If an instance process dies, the benchmark stops at once and shows the end of its log.

Set-up: a lake and an embedded PostgreSQL (one database per participant) in a temporary folder;
every instance is a real process (``python -m cues_platform.participants.instance``). A warm-up
round (30 postings per producer) waits until every instance answers. Producers publish
through ``--slots`` slots each (default 1, the CLI's default: a POSTINGS commit is one writer's turn
on the table, so more slots add contention, not throughput). Two phases:

* ``burst`` (sustained throughput): ``--postings`` are recorded at once (spread over the three
  producers, receivers alternating); ``postings_per_s`` = postings / (last result time − first
  inception time), i.e. how fast the whole pipeline drains a backlog;
* ``paced`` (latency): a feeder records ``--rate`` postings/s (every 50 ms) until
  ``--paced-postings``; ``latency_ms`` p50/p90/p99/max of ``result_at − inception_datum`` (both
  from the PostgreSQL server clock): record → assign → publish → consumer step → RESULTS → applied.

Per stage (from the producers' audit trail): p50 and p99 of record → assigned, assigned → acked,
acked → result applied. ``targets`` (computed): the paced p99 ≤ 1 s at 300 postings/s offered
(issue 26); NOT MEASURED when the paced phase offered another rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from common import machine_info, now_iso, percentile, write_json  # noqa: E402

from cues_platform.participants.db import Database, ensure_database  # noqa: E402
from cues_platform.participants.network import register  # noqa: E402
from cues_platform.participants.postings import Posting, post_many  # noqa: E402
from cues_platform.pgserver_db import embedded_postgres, stop_embedded_postgres  # noqa: E402
from cues_platform.queues import Lake  # noqa: E402

PRODUCERS = ["bank-a", "bank-b", "bank-c"]
CONSUMERS = ["bank-x", "bank-y"]


def spawn(pid: str, role: str, i: int, lake: str, dsn: str, slots: int, env: dict, logs: Path
          ) -> subprocess.Popen:
    log = logs / f"{pid}-{i}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, *(["-m", "cProfile", "-o", f"/tmp/scratch/prof-{pid}-{i}.out"] if role == "consumer" or i == 1 else []), "-m", "cues_platform.participants.instance", "--id", pid, "--role",
             role, "--lake", lake, "--dsn", dsn, "--instance", f"{pid}-{i}", "--slots",
             str(slots)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    PROCS.append((proc, log))
    return proc


def resulted(dsns: dict[str, str]) -> int:
    total = 0
    for p in PRODUCERS:
        with psycopg.connect(dsns[p]) as conn:
            total += conn.execute("SELECT count(*) FROM messages WHERE ack_status = 'acked_result'"
                                  ).fetchone()[0]
    return total


PROCS: list[tuple[subprocess.Popen, Path]] = []  # every spawned instance and its log


def check_alive() -> None:
    """A dead instance means no result will ever come: stop now, with the end of its log."""
    for proc, log in PROCS:
        code = proc.poll()
        if code is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"instance {log.stem} exited with {code}; the end of its log:\n"
                               f"{tail}")


def wait_for(pred, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def summary(result: dict, baseline: dict | None) -> str:
    """One line: the paced p99 and the burst rate, next to the baseline's."""
    def fmt(r: dict) -> str:
        return (f"paced p99 {r['paced']['latency_ms']['p99'] / 1000:.2f} s, "
                f"burst {r['burst']['postings_per_s']:.0f} postings/s "
                f"(commit {r['machine'].get('git_commit')}, {r['at']}, load "
                f"{r.get('load_average_1m', {}).get('start', '?')})")

    line = f"participants: {fmt(result)}"
    if baseline is not None:
        line += f"; baseline: {fmt(baseline)}"
    return line


def run_phase(name: str, dbs: dict, dsns: dict, lake: Lake, count: int, rate: float | None,
              before: int) -> dict:
    """burst (rate None): record ``count`` postings at once, measure how fast they drain;
    paced: feed at ``rate`` postings/s (below capacity) and measure the latency."""
    with psycopg.connect(dsns[PRODUCERS[0]]) as conn:
        t0 = conn.execute("SELECT now()").fetchone()[0]
    per_tick = count if rate is None else max(1, int(rate * 0.05))
    sent, i, start = 0, 0, time.monotonic()
    while sent < count:
        n = min(per_tick, count - sent)
        shares = [n // 3 + (1 if k < n % 3 else 0) for k in range(3)]
        for p, share in zip(PRODUCERS, shares, strict=True):
            if share:
                post_many(dbs[p], None, sender=p, postings=[
                    Posting(CONSUMERS[(i + k) % 2], f"{name}-{i + k:08d}", '{"amount": 1}')
                    for k in range(share)])
                i += share
        sent += n
        if rate is not None:
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    feed_s = time.monotonic() - start
    wait_for(lambda: resulted(dsns) == before + count, 1800, f"{name}: all results")
    lat, firsts, lasts = [], [], []
    stages: dict[str, list[float]] = {}
    for p in PRODUCERS:
        with psycopg.connect(dsns[p]) as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM result_at - inception_datum) * 1000, "
                "inception_datum, result_at FROM messages WHERE inception_datum > %s", (t0,)
            ).fetchall()
            for stage, a, b in (("record_to_assign", "recorded", "assigned"),
                                ("assign_to_ack", "assigned", "posting_acked"),
                                ("ack_to_result", "posting_acked", "result_received")):
                stages.setdefault(stage, []).extend(float(r[0]) for r in conn.execute(
                    "SELECT extract(epoch FROM max(at) FILTER (WHERE action = %s) - "
                    "min(at) FILTER (WHERE action = %s)) * 1000 FROM audit "
                    "WHERE at > %s GROUP BY message_id", (b, a, t0)))
        lat += [float(r[0]) for r in rows]
        firsts += [r[1] for r in rows]
        lasts += [r[2] for r in rows]
    span = (max(lasts) - min(firsts)).total_seconds()
    return {"postings": len(lat), "offered_rate": rate, "feed_seconds": round(feed_s, 2),
            "seconds": round(span, 2), "postings_per_s": round(len(lat) / span, 1),
            "latency_ms": {"p50": round(percentile(lat, 50), 1),
                           "p90": round(percentile(lat, 90), 1),
                           "p99": round(percentile(lat, 99), 1), "max": round(max(lat), 1)},
            "stage_p50_ms": {k: round(percentile([x for x in v if x == x], 50), 1)
                             for k, v in stages.items() if v},
            "stage_p99_ms": {k: round(percentile([x for x in v if x == x], 99), 1)
                             for k, v in stages.items() if v}}


TARGET_RATE = 300.0  # postings/s offered: the rate issue 26's p99 target is defined at
TARGET_P99_S = 1.0


def targets(paced: dict) -> list[dict]:
    """Issue 26: the paced p99 at 300 postings/s offered is at most 1 s (computed, not typed)."""
    p99_s = paced["latency_ms"]["p99"] / 1000
    at_rate = paced["offered_rate"] == TARGET_RATE
    return [{"id": "paced_p99", "target": f"postings paced at {TARGET_RATE:g}/s: p99 latency (s)",
             "measured": round(p99_s, 3) if at_rate else None, "op": "<=", "bound": TARGET_P99_S,
             "result": ("PASS" if p99_s <= TARGET_P99_S else "FAIL") if at_rate else "NOT MEASURED",
             "detail": (f"{paced['postings']} postings; stage p99 ms {paced.get('stage_p99_ms')}"
                        if at_rate else f"offered {paced['offered_rate']}/s, not {TARGET_RATE:g}/s "
                        f"(p99 {p99_s:.3f} s at that rate)")}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--postings", type=int, default=6_000)
    ap.add_argument("--rate", type=float, default=300.0, help="paced phase: postings/s offered")
    ap.add_argument("--paced-postings", type=int, default=3_000)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=1, help="publishing slots per producer")
    ap.add_argument("--out", default=str(HERE / "results" / "participants.json"))
    ap.add_argument("--baseline", default=str(HERE / "results" / "participants.json"),
                    help="results file to compare with (read before --out is written)")
    ap.add_argument("--note", default="", help="recorded in the JSON (e.g. how loaded the machine was)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (numbers meaningless): --postings 300 --paced-postings 150 --rate 100, "
                         "to /tmp/participants-quick.json unless --out is given")
    args = ap.parse_args()
    if args.quick:
        args.postings, args.paced_postings, args.rate = 300, 150, 100.0
        if args.out == ap.get_default("out"):
            args.out = str(Path(tempfile.gettempdir()) / "participants-quick.json")
    baseline_path = Path(args.baseline)
    baseline = json.loads(baseline_path.read_text()) if baseline_path.exists() else None

    base = Path(tempfile.mkdtemp(prefix="cues-bench-participants-"))
    logs = base / "logs"
    logs.mkdir()
    server = embedded_postgres(base / "pg")
    lake = Lake(root=str(base / "lake"))
    register(lake, producers=PRODUCERS, consumers=CONSUMERS)
    dsns = {p: ensure_database(server, f"bench_{p.replace('-', '_')}") for p in PRODUCERS + CONSUMERS}
    dbs = {p: Database(d) for p, d in dsns.items()}
    for db in dbs.values():
        db.migrate()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUES_PARTICIPANT_BATCH_SIZE": str(args.batch_size),
           "CUES_PARTICIPANT_IDLE_POLL": "0.01", "CUES_PARTICIPANT_CONSUMER_BATCH": "5000",
           "CUES_PARTICIPANT_REPLAY_AFTER": "600"}
    procs = [spawn(p, "producer", i, lake.root, dsns[p], args.slots, env, logs)
             for p in PRODUCERS for i in range(args.instances)]
    procs += [spawn(c, "consumer", 0, lake.root, dsns[c], 1, env, logs) for c in CONSUMERS]
    load_start = os.getloadavg()[0]
    try:
        warm = 30
        for p in PRODUCERS:
            post_many(dbs[p], lake, sender=p, postings=[
                Posting(CONSUMERS[i % 2], f"warm-{i}", '{"w": 1}') for i in range(warm)])
        wait_for(lambda: resulted(dsns) == warm * len(PRODUCERS), 300, "warm-up results")
        burst = run_phase("burst", dbs, dsns, lake, args.postings, None, warm * 3)
        done = warm * 3 + args.postings
        paced = run_phase("paced", dbs, dsns, lake, args.paced_postings, args.rate, done)
        result = {
            "benchmark": "participants", "at": now_iso(), "machine": machine_info(),
            "note": args.note,
            "config": {"producers": 3, "instances_per_producer": args.instances,
                       "consumers": 2, "active_consumer_instances": 1,
                       "batch_size": args.batch_size, "slots_per_producer": args.slots},
            "quick": args.quick, "burst": burst, "paced": paced, "targets": targets(paced),
            # other processes on the machine change the numbers: keep the 1-minute load with them
            "load_average_1m": {"start": round(load_start, 1),
                                "end": round(os.getloadavg()[0], 1)},
        }
        write_json(args.out, result)
        print(json.dumps(result, indent=2, default=str))
        print(summary(result, baseline))
    finally:
        for pr in procs:
            pr.send_signal(signal.SIGTERM)
        for pr in procs:
            try:
                pr.wait(60)
            except subprocess.TimeoutExpired:
                pr.kill()
        for db in dbs.values():
            db.close()
        stop_embedded_postgres(base / "pg")
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
