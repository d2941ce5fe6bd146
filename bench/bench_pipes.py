"""Throughput of the six delivery pipes on the in-memory route.

Run: ``.venv/bin/python bench/bench_pipes.py`` (writes ``bench/results/pipes.json``).

Every pipe gets the same burst of ``N`` messages submitted at tick 1, over a lossless route
(latency 1 tick) and over a faulty one (10% loss, 30% of messages delayed 1..5 extra ticks, which
reorders them). A run ends when every message has been delivered, or — for the strict index
pipe, which may lose messages — when the pipe is quiet. Reported per pipe and route, as medians
over ``RUNS`` runs (fault seeds vary per run):

* ``msgs_per_s``: distinct messages delivered per wall-clock second of simulation;
* ``msgs_per_tick``: distinct messages delivered per logical tick (the protocol's throughput,
  independent of the machine);
* ``delivered``/``duplicates``: how many distinct messages came out, and how many extra copies.

The sequential confirm pipe over the faulty route runs over re-send pipes (it needs
at-least-once routes), as does the continuous index pipe (that is the exactly-once composition).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cues_platform.pipes import (
    LOSSLESS,
    Clock,
    ContinuousIndexPipe,
    FaultSchedule,
    FaultyLink,
    MemoryIndexStore,
    MemoryStreamStore,
    Pipe,
    ResendMultiPipe,
    ResendPipe,
    SequentialConfirmPipe,
    Simulation,
    StreamPipe,
    StrictIndexPipe,
    exactly_once_pipe,
    memory_route,
    sequential_over_resend,
)

N = 5000
RUNS = 7
MAX_TICKS = 200_000
OUT = Path(__file__).parent / "results" / "pipes.json"


def lossy(seed: int) -> FaultSchedule:
    return FaultSchedule(seed=seed, drop=0.1, delay=0.3, max_delay=5)


Builder = Callable[[Clock, FaultSchedule], Pipe]


def _stream(clock: Clock, f: FaultSchedule) -> Pipe:
    return StreamPipe(
        store=MemoryStreamStore(),
        writer_route=memory_route(clock, f, name="w"),
        reader_route=memory_route(clock, f, name="r"),
        index_store=MemoryIndexStore(),
        index_route=memory_route(clock, f, name="i"),
    )


def _sequential(clock: Clock, f: FaultSchedule) -> Pipe:
    if f == LOSSLESS:
        return SequentialConfirmPipe(memory_route(clock, f))
    return sequential_over_resend(clock, f)


def _continuous(clock: Clock, f: FaultSchedule) -> Pipe:
    if f == LOSSLESS:
        return ContinuousIndexPipe(FaultyLink(clock, f))
    return exactly_once_pipe(clock, f)


PIPES: dict[str, Builder] = {
    "resend": lambda c, f: ResendPipe(memory_route(c, f)),
    "resend_multi": lambda c, f: ResendMultiPipe(memory_route(c, f)),
    "stream": _stream,
    "sequential_confirm": _sequential,
    "strict_index": lambda c, f: StrictIndexPipe(FaultyLink(c, f)),
    "continuous_index": _continuous,
}


# Only the strict index pipe may lose messages by design; its runs end when its link is empty.
MAY_LOSE = {"strict_index"}


def run_once(name: str, faults: FaultSchedule) -> dict[str, float]:
    clock = Clock()
    sim = Simulation(clock)
    pipe = PIPES[name](clock, faults)
    sim.add(pipe)
    links = [lk for lk in pipe.links() if isinstance(lk, FaultyLink)] if name in MAY_LOSE else []
    seen: set[int] = set()
    copies = 0
    start = time.perf_counter()
    for i in range(N):
        pipe.submit(i)
    for _ in range(MAX_TICKS):
        sim.step()
        out = pipe.receive()
        copies += len(out)
        seen.update(out)
        if len(seen) == N or (links and all(lk.in_flight() == 0 for lk in links)):
            break
    wall = time.perf_counter() - start
    return {
        "msgs_per_s": len(seen) / wall,
        "msgs_per_tick": len(seen) / sim.now,
        "ticks": sim.now,
        "wall_s": wall,
        "delivered": len(seen),
        "duplicates": copies - len(seen),
    }


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> int:
    started = time.perf_counter()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in PIPES:
        results[name] = {}
        for route in ("lossless", "lossy"):
            runs = [
                run_once(name, LOSSLESS if route == "lossless" else lossy(seed))
                for seed in range(RUNS)
            ]
            results[name][route] = median_of(runs)
            m = results[name][route]
            print(
                f"{name:20s} {route:9s} {m['msgs_per_s']:>10.0f} msg/s "
                f"{m['msgs_per_tick']:>7.3f} msg/tick  delivered {m['delivered']:.0f}/{N} "
                f"dups {m['duplicates']:.0f}",
                flush=True,
            )
    ratios = {
        route: {
            f"{other}_over_sequential_{unit}": results[other][route][unit]
            / results["sequential_confirm"][route][unit]
            for other in ("resend_multi", "continuous_index")
            for unit in ("msgs_per_s", "msgs_per_tick")
        }
        for route in ("lossless", "lossy")
    }
    report = {
        "benchmark": "pipes",
        "messages_per_run": N,
        "runs": RUNS,
        "statistic": "median",
        "routes": {
            "lossless": "in-memory, latency 1 tick, no faults",
            "lossy": "in-memory, latency 1 tick, 10% drop, 30% delayed 1..5 ticks (reordered)",
        },
        "machine": {
            "nproc": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "processor": platform.machine(),
        },
        "results": results,
        "sequential_confirm_slowdown": ratios,
        "total_wall_s": time.perf_counter() - started,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(ratios, indent=2))
    print(f"wrote {OUT} in {report['total_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
