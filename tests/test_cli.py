"""The ``cues`` command: audit, backing show, graph show in-process (click's CliRunner), and
``cues run`` as real subprocesses (its own Spark) on a graph file written into tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cues_platform.audit import audit
from cues_platform.cli import main
from cues_platform.processing.loader import load_graph
from cues_platform.queues import Lake
from tests.audit.lakes import MODULE, ORDERS, orders, seed, write_graph
from tests.support import ROOT

SUBPROCESS_TIMEOUT = 240


def cues_run(folder: Path, lake: Path, *extra: str) -> subprocess.Popen[str]:
    """``python -m cues_platform.cli run tests_graph_module:graph`` in ``folder``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cues_platform.cli",
            "run",
            f"{MODULE}:graph",
            "--lake",
            str(lake),
            "--no-progress",
            *extra,
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def ran_lake(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A lake seeded with orders, then processed by ``cues run ... --idle-exit 2``."""
    folder = tmp_path_factory.mktemp("cli")
    graph = load_graph(f"{write_graph(folder)}:graph")
    seed(graph, Lake(root=str(folder / "lake")))
    proc = cues_run(folder, folder / "lake", "--idle-exit", "2")
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    return folder / "lake", subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def invoke(*args: str) -> object:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# -- cues run ---------------------------------------------------------------------------------------
def test_cues_run_processes_everything_then_exits_when_idle(
    ran_lake: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    lake, done = ran_lake
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graph shop: stopped after" in done.stdout and "(idle for 2.0s)" in done.stdout
    assert (
        "enrich (map, exactly_once): 3 step(s), 30 row(s) in, 21 row(s) out, 1 error(s)"
        in done.stdout
    )
    report = audit(Lake(root=str(lake)))
    assert report.ok, report.to_text()
    assert report.processors["enrich"].inputs[0].delivered_end == ORDERS
    assert report.processors["split"].inputs[0].delivered_end == 20


def test_cues_run_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    graph = load_graph(f"{write_graph(tmp_path)}:graph")
    lake = Lake(root=str(tmp_path / "lake"))
    seed(graph, lake)
    proc = cues_run(tmp_path, tmp_path / "lake")  # no --idle-exit: runs until stopped
    enriched = lake.queue("enriched")
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    try:
        while enriched.next_offset("0") == 0:  # poll until it has delivered something
            assert time.monotonic() < deadline, "cues run delivered nothing in time"
            try:
                proc.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"cues run exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "(stop requested)" in out and "enrich (map, exactly_once)" in out
    report = audit(lake)
    assert report.ok, report.to_text()
    assert report.processors["enrich"].steps_delivered >= 1
    assert report.processors["enrich"].pending is None  # the step in flight finished


# -- cues audit -------------------------------------------------------------------------------------
def test_audit_exit_codes_and_output(
    ran_lake: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    lake, _ = ran_lake
    clean = invoke("audit", "--lake", str(lake))
    assert clean.exit_code == 0, clean.output
    assert ": OK" in clean.stdout.splitlines()[0]
    as_json = invoke("audit", "--lake", str(lake), "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["ok"] is True

    shutil.copytree(lake, tmp_path / "lake")
    big = Lake(root=str(tmp_path / "lake")).queue("big")
    end = big.next_offset("0")
    big.append(orders(500, 4), partition="0", delivery_hash="0" * 32)
    bad = invoke("audit", "--lake", str(tmp_path / "lake"))
    assert bad.exit_code == 1
    assert f"[unknown_hash] big/0 offsets [{end}, {end + 4}) hash {'0' * 12}" in bad.stdout
    assert "FAILED: 1 violation(s)" in bad.stdout
    bad_json = invoke("audit", "--lake", str(tmp_path / "lake"), "--json")
    assert bad_json.exit_code == 1
    (v,) = json.loads(bad_json.stdout)["violations"]
    assert (v["kind"], v["queue"], v["partition"], v["offsets"]) == (
        "unknown_hash",
        "big",
        "0",
        [end, end + 4],
    )


def test_bad_lake_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = invoke("audit", "--lake", str(tmp_path / "missing"))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        f"error: no lake at {tmp_path / 'missing'}"
    )
    shown = invoke("backing", "show", "enrich", "--lake", str(tmp_path / "missing"))
    assert shown.exit_code == 2 and shown.stderr.startswith("error: no lake at")


# -- cues backing show / graph show -----------------------------------------------------------------
def test_backing_show_in_words(ran_lake: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    lake, _ = ran_lake
    result = invoke("backing", "show", "enrich", "--lake", str(lake), "-n", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("backing queue of enrich") and "(showing the last 2)" in lines[0]
    assert lines[1].startswith("step 1: snapshot of orders/0 [10, 20) — hash ")
    assert lines[1].endswith("attempt: output 10 rows to enriched/0 (committed)")
    assert lines[2].endswith("attempt: error 'ValueError: bad batch' 1 row to errors/0 (committed)")
    nope = invoke("backing", "show", "nope", "--lake", str(lake))
    assert nope.exit_code == 2 and "no backing queue for processor 'nope'" in nope.stderr


def test_graph_show_prints_mermaid(tmp_path: Path) -> None:
    path = write_graph(tmp_path)
    result = invoke("graph", "show", f"{path}:graph")
    assert result.exit_code == 0, result.output
    assert result.stdout == load_graph(f"{path}:graph").mermaid() + "\n"
    assert result.stdout.startswith("flowchart LR") and "p_split -->|big| q_big" in result.stdout
    missing = invoke("graph", "show", f"{path}:nope")
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1
    assert "has no attribute 'nope'" in missing.stderr


def test_participant_commands_are_part_of_cues() -> None:
    from click.testing import CliRunner

    from cues_platform.cli import main

    result = CliRunner().invoke(main, ["participant", "run", "--help"])
    assert result.exit_code == 0, result.output
    assert "--role" in result.output and "--instances" in result.output
