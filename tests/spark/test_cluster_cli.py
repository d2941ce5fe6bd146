"""``cues spark cluster status|down`` where no cluster runs: nothing started, a stale state file
(its PIDs are gone), a damaged one; and a driver pointed at a master that is not there. One line
each, never a traceback. (``up``/``status``/``down``
of a running cluster: ``tests/spark/conftest.py`` and ``test_cluster.py``.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from cues_platform.errors import JavaNotFoundError
from cues_platform.spark.cluster import start_cluster
from cues_platform.spark.session import (
    SparkMasterUnreachableError,
    SparkSettings,
    require_master,
    use_this_python,
)
from tests.spark.cluster_support import CUES, run

pytestmark = pytest.mark.slow


def cues(*args: str, cwd) -> tuple[int, str]:
    proc = run([CUES, "spark", "cluster", *args], cwd=cwd, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_with_nothing_started_or_a_stale_state_file_status_and_down_say_so(tmp_path):
    folder = tmp_path / "c"
    code, out = cues("status", "--dir", str(folder), cwd=tmp_path)
    assert code == 1 and "no cluster: no state file" in out, out
    code, out = cues("down", "--dir", str(folder), cwd=tmp_path)
    assert code == 0 and "no cluster to stop" in out, out
    folder.mkdir()
    gone = subprocess.Popen(["true"])  # a PID that no longer runs: a short-lived child's
    gone.wait()
    daemon = {"role": "master", "pid": gone.pid, "port": 1, "webui_port": 2, "log": "x"}
    (folder / "state.json").write_text(json.dumps({"folder": str(folder), "master": daemon, "workers": []}))
    code, out = cues("status", "--dir", str(folder), cwd=tmp_path)
    assert code == 1 and "no longer runs (stale state file" in out, out
    code, out = cues("down", "--dir", str(folder), cwd=tmp_path)
    assert code == 0 and "was not running any more (stale state file, now removed)" in out, out
    assert not (folder / "state.json").exists()
    (folder / "state.json").write_text("{not json")
    code, out = cues("down", "--dir", str(folder), cwd=tmp_path)
    assert code == 2 and "is damaged" in out and "delete it" in out, out


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: nothing accepts on it
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_master_that_is_not_there_is_one_line_before_any_jvm(tmp_path):
    url = f"spark://127.0.0.1:{closed_port()}"
    with pytest.raises(SparkMasterUnreachableError, match="cues spark cluster up") as caught:
        require_master(url)
    assert caught.value.master == url and "Connection refused" in str(caught.value)
    # a driver process (`cues run`) with that master: exit 2, one line, no lake written
    lake = tmp_path / "lake"
    proc = run([CUES, "run", "cues_platform/jepsen/user/jepsen_graph.py:graph", "--lake", str(lake),
                "--no-progress", "--idle-exit", "1"], env={"CUES_SPARK_MASTER": url}, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert f"the Spark master {url} is unreachable" in errors[0] and "Traceback" not in proc.stderr
    assert not (lake / "queues").exists()


@pytest.mark.parametrize(("master", "ours"), [("spark://127.0.0.1:7077", True), ("spark://localhost:7077", True),
                                              ("spark://spark-master.internal:7077", False)])
def test_executors_of_a_master_on_this_machine_run_this_python(monkeypatch, master, ours):
    # an executor started by a worker on this machine must run the venv's python (pyarrow, the
    # user's packages), not the first python3 on PATH; a remote cluster's python is its own
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    use_this_python(SparkSettings(master=master))
    assert os.environ.get("PYSPARK_PYTHON") == (sys.executable if ours else None)


def test_without_java_up_says_what_to_install_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))  # Spark's java is JAVA_HOME's first
    with pytest.raises(JavaNotFoundError, match="install it"):
        start_cluster(folder=tmp_path / "c", workers=1)
    assert not (tmp_path / "c").exists()
    proc = run([CUES, "spark", "cluster", "up", "--dir", str(tmp_path / "c")], timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: Spark needs Java 17+"), proc.stderr
    assert not (tmp_path / "c" / "logs").exists()


STUBBORN = """
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); sys.stdin.read()"],
                         stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_stopping_a_daemon_that_ignores_sigterm_returns_once_it_and_its_group_are_gone(tmp_path):
    """A daemon (and an executor in its process group) that ignores SIGTERM past the grace is
    SIGKILLed, and stop_pids returns only once the kernel has ended both: `cues spark cluster down`
    never says "stopped" while a daemon still runs (a clean-clone CI run under load once found a
    worker alive right after `down`)."""
    from cues_platform.spark.daemons import alive, daemon_marker, stop_pids

    marker = daemon_marker(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, marker], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(proc.stdout.readline())
    try:
        assert stop_pids([proc.pid], marker=marker, grace=0.3) == [proc.pid]
        assert not alive(proc.pid) and not alive(child)
        assert proc.wait(30) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
