"""``cues run`` stopped with SIGTERM to its whole process group (which also stops Spark's JVM) in
the middle of a step: no error row, exit 0 with one line naming the interrupted step, and the
next start delivers every row exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cues_platform.processing import GraphRunner
from cues_platform.queues import Lake
from tests.processing.graphs import build_graph, check_exact, load_inputs
from tests.support import ROOT

GRAPH = '''
import os, time
from pathlib import Path
from tests.processing.graphs import build_graph, make_fn

GATE = Path(os.environ["CUES_TEST_GATE"])
plain = make_fn("fork", "output")

def fn(ctx, src):
    if ctx.step == 1 and GATE.joinpath("armed").exists():
        GATE.joinpath("in-step").touch()
        while not GATE.joinpath("go").exists():  # held here until the test has sent SIGTERM
            time.sleep(0.05)
    return plain(ctx, src)

graph = build_graph("fork", fn=fn)
'''


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def wait_for(predicate, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigterm_to_the_process_group_mid_step(spark, tmp_path):
    root, gate = tmp_path / "lake", tmp_path / "gate"
    gate.mkdir()
    (gate / "armed").touch()
    graph_file = tmp_path / "graph.py"
    graph_file.write_text(GRAPH)
    lake = Lake(root=str(root))
    from cues_platform.processing.runner import create_queues

    create_queues(build_graph("fork"), lake)
    load_inputs(lake, "fork")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUES_TEST_GATE": str(gate)}
    proc = subprocess.Popen([sys.executable, "-m", "cues_platform.cli", "run", f"{graph_file}:graph",
                             "--lake", str(root), "--no-progress"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as under a shell
    try:
        wait_for(lambda: (gate / "in-step").exists() or proc.poll() is not None, "step 1 to start")
        assert proc.poll() is None, proc.communicate()
        jvms = children_of(proc.pid)
        assert jvms, "no Spark JVM child"
        os.killpg(proc.pid, signal.SIGTERM)
        wait_for(lambda: not any(Path(f"/proc/{j}").exists() and "zombie" not in
                                 Path(f"/proc/{j}/status").read_text().lower() for j in jvms), "the JVM to stop")
        (gate / "go").touch()  # the function goes on and finds Spark gone
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err[-3000:]
    lines = [x for x in out.splitlines() if x.startswith("graph g: stopped")]
    assert len(lines) == 1 and "stop requested" in lines[0], out
    assert "step 1 of processor 'p' was interrupted and is retried on the next start" in lines[0]
    assert "Traceback" not in err, err[-3000:]
    assert lake.queue("errors").read_arrow(partition="0").num_rows == 0
    (gate / "armed").unlink()
    GraphRunner(graph=build_graph("fork"), lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "fork", "output")
