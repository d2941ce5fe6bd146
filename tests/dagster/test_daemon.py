"""Automation that runs: the real ``dagster-daemon`` on a temporary instance ticks a sensor that
is on by default, and the run it launches materializes the processor (a run worker process of its
own, its own Spark), exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from tests.dagster.graphs import N, expected, ids, load_orders
from tests.support import ROOT

DEADLINE_S = 300  # daemon start, code server, sensor tick, run worker with its Spark, 3 steps


def _workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace.yaml"
    path.write_text("load_from:\n  - python_file:\n"
                    f"      relative_path: {ROOT / 'tests' / 'dagster' / 'daemon_defs.py'}\n"
                    f"      working_directory: {ROOT}\n      location_name: shop\n")
    return path


def test_the_daemon_ticks_a_default_on_sensor_whose_run_materializes_the_processor(tmp_path, lake) -> None:
    load_orders(lake)  # 30 orders: the enrich sensor has something to request
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    log = tmp_path / "daemon.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "CUES_LAKE": lake.root}
    daemon = Path(sys.executable).with_name("dagster-daemon")
    # The instance's sqlite storages (runs, event index, schedules) are created and stamped here,
    # before the daemon starts: two processes creating them at once race on alembic's version
    # table ("table alembic_version already exists", seen once in CI).
    instance = DagsterInstance.from_config(str(home))
    with log.open("wb") as out:
        proc = subprocess.Popen([str(daemon), "run", "-w", str(_workspace(tmp_path))], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        run = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"dagster-daemon exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert "DagsterUserCodeLoadError" not in log.read_text(), log.read_text()[-3000:]
            runs = instance.get_runs(RunsFilter(tags={"cues/trigger": "new_data", "cues/processor": "enrich"}))
            if runs and runs[0].status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE):
                run = runs[0]
                break
            time.sleep(1)  # polling for a condition, with a deadline: not a timing assumption
        assert run is not None, f"no finished sensor run in {DEADLINE_S} s:\n{log.read_text()[-3000:]}"
        assert run.status is DagsterRunStatus.SUCCESS, run.run_id
        assert run.tags["dagster/sensor_name"] == "shop__enrich__new_data"
        assert ids(lake, "enriched") == expected(N)["enriched"]  # each order's row once
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
