"""Spark Connect (issue 13 item 2): a server started and stopped with docs/deployment.md's
commands as printed, processors unchanged over it (the processing tests themselves, run against
the server), a Dagster materialization attached to it, and the edges: an unreachable URL, a
second ``up``, a process whose server went away first.

One server for the module (xdist's ``--dist loadfile`` keeps the file on one worker): its start
is the expensive part (15-50 s on 2 busy cores)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cues_platform.spark import SparkSettings, get_spark
from cues_platform.spark.connect import ConnectServer, ConnectServerUnreachableError
from cues_platform.spark.daemons import alive
from tests.docs.conftest import shell_env
from tests.docs.examples import SHELL, Command, blocks, commands
from tests.processing.graphs import KINDS, OUTCOMES
from tests.support import ROOT

DOC, SECTION = "docs/deployment.md", "Run on Spark Connect"
pytestmark = pytest.mark.slow

# Processing tests run against the server as they are (every file of tests/processing passed over
# Connect once, docs/deployment.md). CI runs two files whole and a selection of the crash matrix
# (the whole matrix costs about 4x as long): every kind (map, join, alts, fork, sink) and outcome
# crashed after_prepare, every attempt path crashed between_commits, crashes at recovery, and one
# SIGKILLed child per kind (its own Connect session). Left out: tests that find or kill the classic
# driver's JVM (there is none over Connect: their counterpart is the server test below).
OVER_CONNECT = [
    "tests/processing/test_executor_output.py",  # Spark writes a step's files, the driver commits them
    "tests/processing/test_failures.py",  # who failed: Connect converts Spark's errors its own way
    "tests/processing/test_crash_matrix.py",  # joins, alts, forks, sinks: crash points (selection below)
]
CRASH_MATRIX_SELECTION = "after_prepare or between_commits or sigkill or recovery_fenced"
SELECTION = f"not test_crash_matrix or {CRASH_MATRIX_SELECTION}"  # the other files whole
CLASSIC_ONLY = "tests/processing/test_failures.py::test_spark_jvm_dying_mid_step_is_a_platform_failure"
# The other one, run_sigterm's JVM child, is in a file not listed here.


def doc(key: str) -> Command:
    found = {c.key: c for b in blocks() if b.file == DOC and b.section == SECTION
             and b.language in SHELL for c in commands(b)}
    return found[key]


def run_doc(key: str, *, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The documented command as printed; the server's workers import this repository's code
    (PYTHONPATH: the processing tests pickle functions of ``tests.*`` modules by reference)."""
    return subprocess.run(["bash", "-c", doc(key).text], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=shell_env(PYTHONPATH=str(ROOT)))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder the documented commands run in; the module's server is in its state file."""
    where = tmp_path_factory.mktemp("spark-connect")
    up = run_doc("cues spark connect up", cwd=where)
    assert up.returncode == 0 and "Traceback" not in up.stderr, up.stdout + up.stderr
    first = current(where)
    assert re.fullmatch(r"sc://127\.0\.0\.1:\d+", first.url), first.url
    assert f"export CUES_SPARK_MASTER={first.url}" in up.stdout.splitlines(), up.stdout
    started = [first]
    try:
        yield where
    finally:
        state = where / ".cues" / "spark-connect" / "state.json"
        if state.exists():
            started.append(current(where))
        for server in started:  # by PID, whatever the last test's `down` left (nothing, unless it failed)
            server.stop(grace=5)


def current(home: Path) -> ConnectServer:
    return ConnectServer.from_dict(json.loads((home / ".cues" / "spark-connect" / "state.json").read_text()))


@pytest.fixture
def server(home: Path) -> ConnectServer:
    return current(home)


def test_status_and_a_second_up_refused(home: Path, server: ConnectServer) -> None:
    status = run_doc("cues spark connect status", cwd=home)
    assert status.returncode == 0 and f"up: {server.url}" in status.stdout, status.stdout + status.stderr
    again = run_doc("cues spark connect up", cwd=home)
    assert again.returncode == 2 and "still runs at" in again.stderr and server.url in again.stderr
    assert "Traceback" not in again.stderr and server.running()


def test_an_unreachable_server_is_one_error_not_ten_minutes_of_retries() -> None:
    with pytest.raises(ConnectServerUnreachableError, match=r"sc://127\.0\.0\.1:1 is unreachable"):
        get_spark(SparkSettings(master="sc://127.0.0.1:1"))


def test_the_processing_tests_pass_over_connect(server: ConnectServer) -> None:
    """The processors' own tests, unchanged, with every Spark call going to the server: maps,
    joins, alts, forks and sinks at crash points (in process and SIGKILLed children), recovery,
    executor-written steps, error classification. Each claimed kind is checked to have passed."""
    env = {**shell_env(), "CUES_SPARK_MASTER": server.url}
    proc = subprocess.run([sys.executable, "-m", "pytest", *OVER_CONNECT, "--deselect", CLASSIC_ONLY,
                           "-k", SELECTION, "-n", "0", "-q", "-rA", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=1200)
    tail = proc.stdout[-4000:]
    assert proc.returncode == 0, tail + proc.stderr[-2000:]
    passed = {line.split(" ", 1)[1].split(" - ")[0] for line in proc.stdout.splitlines()
              if line.startswith("PASSED ")}
    matrix = "tests/processing/test_crash_matrix.py::"
    for kind in KINDS:  # map, join, alts, fork, sink: every outcome at a crash point, a real kill
        assert {f"{matrix}test_crash_point_matrix[{kind}-{outcome}-after_prepare]"
                for outcome in OUTCOMES} <= passed, (kind, sorted(passed))
        assert f"{matrix}test_sigkill_child_then_recover[{kind}]" in passed, (kind, sorted(passed))
        assert f"{matrix}test_crash_at_recovery_fenced[{kind}]" in passed, (kind, sorted(passed))
    whole = sum(p.startswith(tuple(f"{name}::" for name in OVER_CONNECT[:2])) for p in passed)
    assert whole >= 15, sorted(passed)  # the two files run whole: 16 tests at this writing
    assert len(passed) >= 48 and "failed" not in tail.splitlines()[-1], tail  # 48 at this writing


def test_a_dagster_materialization_attached_to_the_server(server: ConnectServer, tmp_path: Path) -> None:
    """A run process (the bench's child: definitions + ``materialize``) attached over Connect
    delivers its step; its Spark session is the server's, not a JVM of its own."""
    child = ROOT / "bench" / "connect_child.py"
    lake = tmp_path / "lake"
    subprocess.run([sys.executable, str(child), "--lake", str(lake), "--mode", "prepare"], check=True,
                   cwd=ROOT, timeout=300)
    proc = subprocess.run([sys.executable, str(child), "--lake", str(lake), "--mode", "materialize"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**shell_env(), "CUES_SPARK_MASTER": server.url})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 10_000 and result["connect"] is True, result


KILLED_MID_STEP = """
import json, os, signal, sys
from pyspark.sql.connect.client.retries import DefaultPolicy
from cues_platform.processing import GraphRunner
from cues_platform.processing.errors import PlatformStepError
from cues_platform.queues import Lake
from cues_platform.spark import get_spark
from tests.processing.graphs import build_graph, load_inputs

lake, server_pid = Lake(root=sys.argv[1]), int(sys.argv[2])
spark = get_spark()
# the test's only change: retry a gone server for seconds, not the default 10 minutes
spark.client.set_retry_policies([DefaultPolicy(max_retries=3, initial_backoff=100, max_backoff=500)])

def hook(point):
    if point == "after_read":  # the frames are planned, the function's plan has not run yet
        os.killpg(server_pid, signal.SIGKILL)

runner = GraphRunner(graph=build_graph("map"), lake=lake, spark=spark, hook=hook)
load_inputs(lake, "map")
try:
    runner.run_until_idle()
except PlatformStepError as exc:
    print(json.dumps({"step": exc.step, "phase": exc.phase, "cause": exc.cause_type}))
"""

RESUMED = """
import sys
from cues_platform.processing import GraphRunner
from cues_platform.queues import Lake
from cues_platform.spark import get_spark
from tests.processing.graphs import build_graph, check_exact

lake = Lake(root=sys.argv[1])
GraphRunner(graph=build_graph("map"), lake=lake, spark=get_spark()).run_until_idle()
check_exact(lake, "map", "output")
print("exact")
"""


def test_a_server_killed_mid_step_is_a_platform_failure_and_a_new_one_delivers_once(
        home: Path, server: ConnectServer, tmp_path: Path) -> None:
    """SIGKILL of the server's process group while a step runs: the step fails as the platform's
    (no error row, nothing delivered); ``up`` again (the state file names a dead server) and the
    next start delivers every step once (the crash matrix's own check)."""
    lake = tmp_path / "lake"
    env = {**shell_env(PYTHONPATH=str(ROOT)), "CUES_SPARK_MASTER": server.url}
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_STEP, str(lake), str(server.pid)], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == 0, killed.stdout[-2000:] + killed.stderr[-3000:]
    failed = json.loads(killed.stdout.strip().splitlines()[-1])
    assert failed["step"] == 0 and failed["phase"] == "materialize", failed
    assert not server.running()
    up = run_doc("cues spark connect up", cwd=home)
    assert up.returncode == 0 and "Traceback" not in up.stderr, up.stdout + up.stderr
    again = current(home)
    assert again.pid != server.pid and again.running()
    resumed = subprocess.run([sys.executable, "-c", RESUMED, str(lake)], cwd=ROOT, capture_output=True,
                             text=True, timeout=600, env={**env, "CUES_SPARK_MASTER": again.url})
    assert resumed.returncode == 0 and resumed.stdout.strip().endswith("exact"), \
        resumed.stdout[-2000:] + resumed.stderr[-3000:]


def test_down_stops_the_server_and_an_attached_process_still_exits(home: Path, server: ConnectServer) -> None:
    """Last in the file: ``down`` stops the server by PID while a process is attached; that
    process then exits at once (pyspark's own exit hook would retry the gone server for minutes)."""
    code = ("import sys; from cues_platform.spark import get_spark, SparkSettings; "
            f"s = get_spark(SparkSettings(master={server.url!r})); assert s.range(3).count() == 3; "
            "print('attached', flush=True); sys.stdin.readline()")
    attached = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=shell_env())
    try:
        assert attached.stdout.readline().strip() == "attached"
        down = run_doc("cues spark connect down", cwd=home, timeout=120)
        assert down.returncode == 0 and f"stopped {server.url}" in down.stdout, down.stdout + down.stderr
        assert not alive(server.pid) and not (Path(server.folder) / "state.json").exists()
        attached.stdin.write("\n")
        attached.stdin.flush()
        assert attached.wait(timeout=60) == 0
    finally:
        attached.kill()
        attached.wait()
    status = run_doc("cues spark connect status", cwd=home)
    assert status.returncode == 1 and "no Connect server" in status.stdout
