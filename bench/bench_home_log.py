"""Log entries of a shared home queue after many steps (issue 22, item 3).

The reference pipeline's ``intake`` is one processor over the four partitions of ``postings``:
four lanes whose step commits all go to one home queue (``instructions``). Trimming per
processor stopped below the other lanes' oldest step commit, so in a shared home no lane's trim
passed another's and the log grew for the whole retention. Home digests hold every processor's
steps (``processing/history.py``, ``HomeDigests``), so the trim below them works for lanes too.

Each scenario makes real step commits (``home.commit_step`` after a real fence, one row each,
lanes in turn) and digests and trims as the stepper does (each of n lanes sharing a home every
``backing_maintenance_every / n`` of its steps; the previous rule: every
``backing_maintenance_every`` steps of a lane): ``4 lanes`` (intake's shape), ``1 processor`` (the same number of steps by
one processor alone), and ``4 lanes, previous rule`` (the trim per processor, stopped below any
other processor's oldest step commit, as the code before home digests did). Entries are the
``_delta_log/*.json`` files left at the end; PASS when the shared home keeps no more than twice
the entries of one processor alone.

    python bench/bench_home_log.py --steps 5000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_info, now_iso, write_json  # noqa: E402

from cues_platform.processing.backing import BackingQueue, Range, RecordType, Snapshot  # noqa: E402
from cues_platform.processing.history import HomeDigests  # noqa: E402
from cues_platform.processing.home import STEP_RECORD_KEY, commit_step, fence_home  # noqa: E402
from cues_platform.queues import Lake  # noqa: E402
from cues_platform.queues.integrity import TableStorage  # noqa: E402
from cues_platform.queues.maintenance import trim_log  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
EVERY = 1_000  # Options.backing_maintenance_every's default


def entries(home) -> int:
    return len(list((home.lake.local_path(home.uri) / "_delta_log").glob("*.json")))


def previous_rule_trim(home, pid: str, upto: int) -> None:
    """The trim before home digests: below ``upto`` but never below another processor's oldest
    step commit still in the log."""
    others = [int(e["version"]) for e in home.refresh().history()
              if e.get(STEP_RECORD_KEY) == "commit" and e.get("cues.processor") != pid]
    trim_log(TableStorage(home.uri, home.lake.options), upto=min([upto, *others]))


def scenario(root: str, *, lanes: int, steps: int, previous_rule: bool) -> dict:
    lake = Lake(root=root)
    parts = [str(i) for i in range(lanes)]
    lake.create_queue("postings", schema=SCHEMA, partitions=parts)
    home = lake.create_queue("instructions", schema=SCHEMA)
    pids = ["intake" if p == "0" else f"intake.{p}" for p in parts]
    epochs = {}
    for pid in pids:
        epochs[pid] = BackingQueue(lake, pid).fence()
        assert fence_home(home, pid, epochs[pid]) is None
    done = dict.fromkeys(pids, 0)
    t0 = time.perf_counter()
    for i in range(steps):
        k = i % lanes
        pid, part = pids[k], parts[k]
        n = done[pid]
        snap = Snapshot(pid, n, {"postings": Range("postings", part, n, n + 1)})
        commit_step(home, snap, {"0": pa.table({"id": [i]}, schema=SCHEMA)}, epoch=epochs[pid],
                    outcome=RecordType.ATTEMPT_OUTPUT, rows={"instructions": {"0": 1}}, is_record=True)
        done[pid] = n + 1
        if previous_rule and done[pid] % EVERY == 0:  # each lane's maintenance point then
            previous_rule_trim(home, pid, home.refresh().version())
        elif not previous_rule and done[pid] % (EVERY // lanes) == 0:
            # now: each of n lanes in one home digests every EVERY / n of its steps
            # (ExactlyOnceStepper.sharing_home), a digest holding every lane's steps
            upto = HomeDigests(lake, home.name).digest(home)
            trim_log(TableStorage(home.uri, home.lake.options), upto=upto)
    seconds = time.perf_counter() - t0
    return {"lanes": lanes, "steps": steps, "previous_rule": previous_rule,
            "log_entries": entries(home), "home_version": home.refresh().version(),
            "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "home_log.json"))
    args = parser.parse_args()
    results = []
    for lanes, previous in ((4, False), (1, False), (4, True)):
        with tempfile.TemporaryDirectory() as tmp:
            r = scenario(str(Path(tmp) / "lake"), lanes=lanes, steps=args.steps, previous_rule=previous)
        print(r, flush=True)
        results.append(r)
    shared, alone = results[0]["log_entries"], results[1]["log_entries"]
    verdict = "PASS" if shared <= 2 * alone else "FAIL"
    print(f"4 lanes: {shared} entries, 1 processor: {alone}, previous rule: "
          f"{results[2]['log_entries']} -> {verdict}")
    write_json(args.out, {"benchmark": "home_log", "at": now_iso(), "machine": machine_info(),
                          "steps": args.steps, "every": EVERY, "results": results,
                          "target": "4 lanes <= 2x one processor's log entries", "verdict": verdict})


if __name__ == "__main__":
    main()
