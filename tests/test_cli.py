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

import pyarrow as pa
import pytest
from click.testing import CliRunner

from cues_platform.audit import audit
from cues_platform.cli import main
from cues_platform.processing.loader import load_graph
from cues_platform.queues import Lake, OffsetLayout
from tests.audit.lakes import MODULE, ORDERS, orders, seed, write_graph
from tests.support import ROOT

SUBPROCESS_TIMEOUT = 240


def cues_run(folder: Path, lake: Path, *extra: str, new_session: bool = False) -> subprocess.Popen[str]:
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
        start_new_session=new_session,  # its own process group, as under a shell
    )


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill a child a failed test left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def events_of(stderr: str) -> list[dict]:
    """The JSON event lines of ``cues run --no-progress`` (Spark's own lines are not JSON)."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith('{"ts": ')]


@pytest.fixture(scope="module")
def ran_lake(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A lake seeded with orders, then processed by ``cues run ... --idle-exit 2``."""
    folder = tmp_path_factory.mktemp("cli")
    graph = load_graph(f"{write_graph(folder)}:graph")
    seed(graph, Lake(root=str(folder / "lake")))
    proc = cues_run(folder, folder / "lake", "--idle-exit", "2", "--status-file",
                    str(folder / "status" / "run.json"))
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


def test_cues_run_emits_one_event_per_happening_and_keeps_a_status_file(
    ran_lake: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """started, spark_ready (its seconds), recovered per processor, step per delivered step with
    the hash the lake recorded, idle, stopped; the status file ends with the same."""
    from cues_platform.processing.history import processor_history

    lake, done = ran_lake
    events = events_of(done.stderr)
    names = [e["event"] for e in events]
    assert names[:2] == ["started", "spark_ready"] and names[-1] == "stopped", names
    assert events[1]["seconds"] > 0 and events[-1]["why"] == "idle for 2.0s"
    assert {e["processor"] for e in events if e["event"] == "recovered"} == {"enrich", "split"}
    assert "idle" in names and names.index("idle") > max(i for i, n in enumerate(names) if n == "step")
    steps = [e for e in events if e["event"] == "step" and e["processor"] == "enrich"]
    recorded = [r for r in processor_history(Lake(root=str(lake)), "enrich") if r.is_attempt]
    assert [(e["step"], e["delivery_hash"]) for e in steps] == [(r.step, r.hash) for r in recorded]
    assert steps[0]["ranges"]["orders"] == ["orders", "0", 0, 10] and steps[0]["rows_in"] == 10
    status = json.loads((lake.parent / "status" / "run.json").read_text())
    assert status["state"] == "stopped" and status["spark_start_seconds"] == events[1]["seconds"]
    assert status["processors"]["enrich"]["steps"] == 3
    assert status["processors"]["enrich"]["last_delivery_hash"] == steps[-1]["delivery_hash"]
    assert status["last_event"]["event"] == "stopped"


def test_a_stop_while_spark_starts_is_one_line_and_exit_0(tmp_path: Path) -> None:
    """SIGTERM to the whole process group right after ``started`` (Spark's JVM is starting and
    gets it too): no traceback, exit 0, one line; nothing was processed, the lake audits clean."""
    graph = load_graph(f"{write_graph(tmp_path)}:graph")
    lake = Lake(root=str(tmp_path / "lake"))
    seed(graph, lake)
    proc = cues_run(tmp_path, tmp_path / "lake", new_session=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        while first and not first.startswith('{"ts": '):
            first = proc.stderr.readline()
        assert json.loads(first)["event"] == "started", first
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        reap(proc)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert out.startswith("graph shop: stopped after") and "stop requested" in out, out
    assert events_of(err)[-1]["event"] == "stopped"
    assert audit(lake).ok


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
        reap(proc)
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
    assert lines[1].startswith("step 1: reads orders/0 [10, 20) — hash ")  # a one-commit step
    assert lines[1].endswith("): output 10 rows to enriched/0 (committed)") and "one commit (version" in lines[1]
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


# -- every command on a damaged, missing or read-only lake: one line, non-zero, no traceback -------
CUES = str(ROOT / ".venv" / "bin" / "cues")
QUEUE_COMMANDS = (
    ("queue", "ls"),
    ("queue", "show", "orders"),
    ("queue", "tail", "orders"),
    ("queue", "maintain", "orders"),
)


def small_lake(folder: Path) -> Path:
    """A lake with one queue of three commits (no Spark needed)."""
    lake = Lake(root=str(folder / "lake"))
    q = lake.create_queue("orders", schema=orders(0, 1).schema)
    for start in (0, 10, 20):
        q.append(orders(start, 10), partition="0")
    return folder / "lake"


def damage(lake: Path, how: str) -> Path:
    """Damage the orders queue the way a storage fault does; returns the file at fault."""
    table = lake / "queues" / "orders"
    newest = sorted((table / "_delta_log").glob("*.json"))[-1]
    if how == "emptied commit":
        newest.write_bytes(b"")
        return newest
    if how == "truncated commit":
        newest.write_bytes(newest.read_bytes()[:60])
        return newest
    if how == "missing data file":
        data = sorted(table.rglob("*.parquet"))[0]
        data.unlink()
        return data
    shutil.rmtree(table / "_delta_log")  # "no log"
    return table / "_delta_log"


def one_error_line(result: object) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "how", ["emptied commit", "truncated commit", "missing data file", "no log"]
)
def test_every_queue_command_fails_in_one_line_on_a_damaged_queue(tmp_path: Path, how: str) -> None:
    lake = small_lake(tmp_path)
    bad_file = damage(lake, how)
    for command in QUEUE_COMMANDS:
        result = invoke(*command, "--lake", str(lake))
        assert result.exit_code == 2, (command, result.output)
        line = one_error_line(result)
        assert "orders" in line and str(bad_file) in line, (command, line)
        assert "restore" in line, (command, line)  # what to do
    audited = invoke("audit", "--lake", str(lake))
    assert audited.exit_code == 1 and str(bad_file) in audited.stdout, audited.output
    assert "[unreadable] orders" in audited.stdout or "[corrupt_log] orders" in audited.stdout


@pytest.mark.parametrize("where", ["missing", "a file"])
def test_every_command_fails_in_one_line_on_a_missing_lake(tmp_path: Path, where: str) -> None:
    path = tmp_path / "nowhere"
    if where == "a file":
        path.write_text("not a lake\n")
    commands = [*QUEUE_COMMANDS, ("audit",), ("backing", "show", "enrich")]
    for command in commands:
        result = invoke(*command, "--lake", str(path))
        assert result.exit_code == 2, (command, result.output)
        assert one_error_line(result).startswith(f"error: no lake at {path}"), command
    missing_graph = invoke("graph", "show", f"{tmp_path / 'nowhere.py'}:graph")
    assert missing_graph.exit_code == 2 and "does not exist" in one_error_line(missing_graph)


def test_backing_show_fails_in_one_line_on_a_damaged_backing_queue(
    ran_lake: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    lake, _ = ran_lake
    shutil.copytree(lake, tmp_path / "lake")
    commit = sorted((tmp_path / "lake" / "_cues" / "backing" / "enrich" / "_delta_log").glob("*.json"))[-1]
    commit.write_bytes(commit.read_bytes()[:40])
    result = invoke("backing", "show", "enrich", "--lake", str(tmp_path / "lake"))
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "backing/enrich" in line and str(commit) in line and "restore" in line
    audited = invoke("audit", "--lake", str(tmp_path / "lake"))
    assert audited.exit_code == 1 and "[unreadable] backing/enrich" in audited.stdout


def read_only(lake: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``cues`` on ``lake`` with the lake not writable: chmod for a normal user; root writes
    through permissions, so as root a read-only bind mount in a private mount namespace."""
    command = [CUES, *argv, "--lake", str(lake)]
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(lake)], check=True)
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(lake)], check=True)
    script = (
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && touch "$1/probe" 2>/dev/null '
        '&& { echo "the lake is still writable" >&2; exit 99; }; shift; exec "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(lake), *command],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
    )  # fmt: skip


def test_read_only_lake_reads_work_and_writes_fail_in_one_line(tmp_path: Path) -> None:
    lake = small_lake(tmp_path)
    listed = read_only(lake, "queue", "ls")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "orders" in listed.stdout and "Traceback" not in listed.stderr
    audited = read_only(lake, "audit")
    assert audited.returncode == 0 and ": OK" in audited.stdout, audited.stderr[-2000:]
    maintained = read_only(lake, "queue", "maintain", "orders")
    assert maintained.returncode == 2, maintained.stderr[-2000:]
    assert "Traceback" not in maintained.stderr
    errors = [line for line in maintained.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: cannot write to orders at "), errors
    assert "not writable" in errors[0]


BROKEN_GRAPH = '''
import pyarrow as pa
from cues_platform.processing import Graph, QueueDef


class BrokenGraph(Graph):
    def mermaid(self) -> str:
        raise RuntimeError("boom in mermaid")


graph = BrokenGraph.build(name="broken", queues=[QueueDef("q", pa.schema([("x", pa.int64())]))],
                          processors=[])
'''


def test_an_unexpected_error_is_one_line_with_a_debug_hint(tmp_path: Path) -> None:
    path = tmp_path / "broken_graph.py"
    path.write_text(BROKEN_GRAPH)
    env = {k: v for k, v in os.environ.items() if k != "CUES_DEBUG"}
    plain = subprocess.run([CUES, "graph", "show", f"{path}:graph"], capture_output=True,
                           text=True, env=env, timeout=SUBPROCESS_TIMEOUT)
    assert plain.returncode == 3 and "Traceback" not in plain.stderr, plain.stderr
    assert plain.stderr.splitlines() == [
        "error: unexpected RuntimeError: boom in mermaid (a bug in cues_platform: rerun with "
        "CUES_DEBUG=1 for the traceback and report it)"
    ]
    debug = subprocess.run([CUES, "graph", "show", f"{path}:graph"], capture_output=True,
                           text=True, env={**env, "CUES_DEBUG": "1"}, timeout=SUBPROCESS_TIMEOUT)
    assert debug.returncode == 3 and "Traceback (most recent call last)" in debug.stderr
    assert 'raise RuntimeError("boom in mermaid")' in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("error: unexpected RuntimeError")


def test_queue_maintain_refuses_a_short_retention_in_one_line(tmp_path):
    import pyarrow as pa
    from click.testing import CliRunner

    from cues_platform.cli import main
    from cues_platform.queues import Lake

    lake = Lake(root=str(tmp_path / "lake"))
    lake.create_queue("orders", schema=pa.schema([("a", pa.int64())]), partitions=["0"])
    lake.queue("orders").append({"a": [1]}, partition="0")
    runner = CliRunner()
    refused = runner.invoke(main, ["queue", "maintain", "orders", "--lake", lake.root,
                                   "--retention-hours", "0.5"])
    assert refused.exit_code == 2, refused.output
    assert "Traceback" not in refused.output and "unsafe" in refused.output.lower()
    allowed = runner.invoke(main, ["queue", "maintain", "orders", "--lake", lake.root,
                                   "--retention-hours", "0.5", "--unsafe-allow-short-retention"])
    assert allowed.exit_code == 0, allowed.output
    assert lake.queue("orders").read_arrow(partition="0", start=0, end=1)["a"].to_pylist() == [1]


@pytest.mark.parametrize(("layout", "shown"), [("absolute", "offsets: absolute (format 1)"),
                                               ("based", "offsets: based (format 2)")])
def test_queue_show_names_the_offset_layout(tmp_path: Path, layout: str, shown: str) -> None:
    lake = Lake(root=str(tmp_path / "lake"))
    q = lake.create_queue("q", schema=pa.schema([("id", pa.int64())]),
                          offset_layout=OffsetLayout(layout))
    q.append(pa.table({"id": [1, 2, 3]}), partition="0")
    result = invoke("queue", "show", "q", "--lake", str(tmp_path / "lake"))
    assert result.exit_code == 0, result.output
    assert shown in result.output and "3" in result.output
