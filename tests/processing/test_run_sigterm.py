"""``cues run`` stopped with SIGTERM to its whole process group in the middle of a step. The
driver's JVM is in a process group of its own (cues_platform/spark/session.py), so the group's
SIGTERM is a graceful stop: the step in flight finishes, exit 0 with one line, no error row, the
next start delivers every row exactly once. Should the JVM die under the stop anyway (killed on its
own), the step fails with a platform error: no error row, exit 0 with one line naming the
interrupted step, and the next start delivers it once."""

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


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def wait_for(predicate, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stop_mid_step(tmp_path: Path, *, kill_jvm: bool) -> tuple[Lake, subprocess.Popen[str], str, str]:
    """Start `cues run` in its own process group, SIGTERM the group while step 1 is held in the
    function (and SIGKILL the JVM itself when ``kill_jvm``), then let the step go on."""
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
        assert all(os.getpgid(j) != proc.pid for j in jvms)  # the group's SIGTERM does not reach it
        os.killpg(proc.pid, signal.SIGTERM)
        if kill_jvm:
            for j in jvms:
                os.kill(j, signal.SIGKILL)
            wait_for(lambda: not any(alive(j) for j in jvms), "the JVM to stop")
        (gate / "go").touch()  # the function goes on (and finds Spark gone when kill_jvm)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (gate / "armed").unlink()
    return lake, proc, out, err


def test_sigterm_to_the_process_group_mid_step(spark, tmp_path):
    lake, proc, out, err = stop_mid_step(tmp_path, kill_jvm=False)
    assert proc.returncode == 0, out + err[-3000:]
    lines = [x for x in out.splitlines() if x.startswith("graph g: stopped")]
    assert len(lines) == 1 and lines[0].endswith("s (stop requested)"), out  # step 1 finished
    assert "p (fork, exactly_once): 2 step(s), 20 row(s) in" in out, out
    assert "Traceback" not in err and "at org.apache" not in err, err[-3000:]
    assert lake.queue("errors").read_arrow(partition="0").num_rows == 0
    GraphRunner(graph=build_graph("fork"), lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "fork", "output")


def test_a_jvm_killed_under_a_requested_stop_interrupts_the_step(spark, tmp_path):
    lake, proc, out, err = stop_mid_step(tmp_path, kill_jvm=True)
    assert proc.returncode == 0, out + err[-3000:]
    lines = [x for x in out.splitlines() if x.startswith("graph g: stopped")]
    assert len(lines) == 1 and "stop requested" in lines[0], out
    assert "step 1 of processor 'p' was interrupted and is retried on the next start" in lines[0]
    assert "Traceback" not in err, err[-3000:]
    assert lake.queue("errors").read_arrow(partition="0").num_rows == 0
    GraphRunner(graph=build_graph("fork"), lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "fork", "output")
