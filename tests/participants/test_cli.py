"""``cues participant``: register, migrate, post (clear errors on bad input), check, and ``run``
(the supervisor: exit codes, the instances' errors in its output, restart backoff)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa
from click.testing import CliRunner

from cues_platform.participants.cli import participant
from cues_platform.participants.db import MIGRATIONS, Database
from cues_platform.participants.model import RESULTS, RESULTS_SCHEMA
from cues_platform.participants.producer import ProducerInstance
from cues_platform.participants.supervise import EXIT_INSTANCE_FAILED, Supervisor, restart_delay
from cues_platform.queues import Lake
from tests.participants.harness import child_env, wait_until
from tests.support import ROOT


def test_cli_register_post_check(tmp_path: Path, make_db: Callable[[str], str]) -> None:
    lake, dsn = str(tmp_path / "lake"), make_db("bank-a")
    cli = CliRunner()
    ok = cli.invoke(participant, ["register", "--lake", lake, "--producer", "bank-a",
                                  "--consumer", "bank-x"])
    assert ok.exit_code == 0, ok.output
    out = cli.invoke(participant, ["migrate", "--id", "bank-a", "--dsn", dsn])
    applied = [v for v, _, _ in MIGRATIONS]  # every migration of db.MIGRATIONS, once
    assert out.exit_code == 0 and f"applied migrations {applied}" in out.output, out.output
    args = ["post", "--id", "bank-a", "--lake", lake, "--dsn", dsn, "--to", "bank-x"]
    out = cli.invoke(participant, [*args, "--count", "3", "--prefix", "p"])
    assert out.exit_code == 0 and "recorded 3" in out.output, out.output
    dup = cli.invoke(participant, [*args, "--count", "1", "--prefix", "p"])
    assert dup.exit_code == 2 and "already recorded message id(s) ['p-00000000']" in dup.output
    unknown = cli.invoke(participant, ["post", "--id", "bank-a", "--lake", lake, "--dsn", dsn,
                                       "--to", "bank-nope", "--prefix", "q"])
    assert unknown.exit_code == 2 and "not a registered consumer" in unknown.output
    big = cli.invoke(participant, [*args, "--prefix", "b", "--payload", "x" * 70_000])
    assert big.exit_code == 2 and "exceeds max_payload_bytes" in big.output
    good = cli.invoke(participant, ["check", "--id", "bank-a", "--dsn", dsn, "--lake", lake])
    assert good.exit_code == 0, good.output
    # a result for an unknown message fails the check
    Lake(root=lake).queue(RESULTS).append(pa.table(
        {"sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["ghost"], "replays": [0],
         "status": ["OK"], "reason": [None], "processed_at": [None]}, schema=RESULTS_SCHEMA),
        partition="bank-a")
    inst = ProducerInstance(participant="bank-a", lake=Lake(root=lake), dsn=dsn, instance_id="t")
    inst.start()
    inst.apply_results_once()
    bad = cli.invoke(participant, ["check", "--id", "bank-a", "--dsn", dsn, "--lake", lake])
    assert bad.exit_code == 1 and "issue unknown_message" in bad.output and "ghost" in bad.output
    inst.close()
    Database(dsn).close()


def _run_cli(args: list[str], *, log: Path, env: dict[str, str] | None = None
             ) -> subprocess.Popen:
    """``python -m cues_platform.participants.cli run ...`` with stdout+stderr in ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cues_platform.participants.cli", "run", *args], cwd=ROOT,
            env=env or child_env(), stdout=out, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen, log: Path) -> str:
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return log.read_text(errors="replace")


def test_cli_run_spawns_instances(tmp_path: Path, make_db: Callable[[str], str]) -> None:
    """``participant run --instances 2`` with settings from ``--config``: two processes publish the
    recorded postings in publications of the file's batch size; stopped with SIGTERM, the run
    exits 0 after both instances printed their stats. Deterministic: it waits (bounded poll) for
    the database to show every posting acked instead of relying on ``--idle-exit`` timing, and
    every assertion shows the run's output (the instances' stderr is forwarded into it)."""
    lake, dsn = str(tmp_path / "lake"), make_db("bank-a")
    cli = CliRunner()
    cli.invoke(participant, ["register", "--lake", lake, "--producer", "bank-a",
                             "--consumer", "bank-x"])
    out = cli.invoke(participant, ["post", "--id", "bank-a", "--lake", lake, "--dsn", dsn,
                                   "--to", "bank-x", "--count", "40", "--prefix", "r"])
    assert out.exit_code == 0, out.output
    config = tmp_path / "participant.toml"
    config.write_text("batch_size = 10\nidle_poll = 0.01\n")
    log = tmp_path / "run.log"
    proc = _run_cli(["--id", "bank-a", "--role", "producer", "--instances", "2", "--lake", lake,
                     "--dsn", dsn, "--config", str(config)], log=log)
    db = Database(dsn)

    def done() -> bool:
        """40 postings acked, and both instances connected (so both installed their SIGTERM
        handler: an instance still importing when SIGTERM comes dies without its stats line)."""
        assert proc.poll() is None, f"run exited {proc.returncode}:\n{log.read_text()}"
        acked, running = db.run(lambda c: c.execute(
            "SELECT (SELECT count(*) FROM messages WHERE ack_status = 'acked_posting'), "
            "(SELECT count(DISTINCT split_part(application_name, ':', 3)) FROM pg_stat_activity "
            " WHERE datname = current_database() AND application_name LIKE "
            " 'cues-participant:bank-a:bank-a-%%')").fetchone())
        return acked == 40 and running == 2

    try:
        wait_until(done, timeout=120, what=f"40 acked postings and 2 instances; output: {log}")
    finally:
        proc.send_signal(signal.SIGTERM)
        text = _finish(proc, log)
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "failed" not in text, text
    assert len([line for line in text.splitlines() if line.startswith("{")]) == 2, text
    sizes = db.run(lambda c: c.execute(
        "SELECT count(*) FROM publication_items GROUP BY slot, seq").fetchall())
    assert sorted(n for (n,) in sizes) == [10, 10, 10, 10], text  # batch_size from the file
    assert Lake(root=lake).queue("postings").read_arrow(partition="bank-x").num_rows == 40
    db.close()


def _broken_db(make_db: Callable[[str], str]) -> str:
    """A database where migration 1 cannot run: an instance fails at start, every time."""
    dsn = make_db("bank-a")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE messages (x int)")
    return dsn


def test_run_no_restart_reports_a_failed_instance(tmp_path: Path,
                                                  make_db: Callable[[str], str]) -> None:
    """Issue 10 item 4: an instance failing at start made ``run --no-restart`` exit 0 with a bare
    traceback. Now the instance logs one line (no traceback without CUES_DEBUG), the run names
    the instance, its exit code and that line, and exits 4."""
    lake, dsn = str(tmp_path / "lake"), _broken_db(make_db)
    CliRunner().invoke(participant, ["register", "--lake", lake, "--producer", "bank-a"])
    log = tmp_path / "run.log"
    proc = _run_cli(["--id", "bank-a", "--role", "producer", "--lake", lake, "--dsn", dsn,
                     "--no-restart"], log=log)
    text = _finish(proc, log)
    assert proc.returncode == EXIT_INSTANCE_FAILED == 4, text
    assert "Traceback" not in text, text
    line = 'error: instance: unexpected DuplicateTable: relation "messages" already exists'
    assert f"] {line}" in text, text  # forwarded from the instance's stderr
    failed = [x for x in text.splitlines() if x.startswith("instance 0 (bank-a-0-")]
    assert len(failed) == 1 and "failed with exit code 3" in failed[0] and line in failed[0], text
    # CUES_DEBUG=1: the instance's traceback is in the log too
    proc = _run_cli(["--id", "bank-a", "--role", "producer", "--lake", lake, "--dsn", dsn,
                     "--no-restart"], log=log, env={**child_env(), "CUES_DEBUG": "1"})
    text = _finish(proc, log)
    assert proc.returncode == 4 and "Traceback (most recent call last)" in text, text


def test_run_restarts_a_failing_instance_with_capped_backoff(
        tmp_path: Path, make_db: Callable[[str], str]) -> None:
    """Restarts on: a failing instance is restarted after 0.1, 0.2, 0.2 s (doubling, capped by
    --restart-backoff-max), not in a tight loop; stopped while failing, the run exits 4."""
    lake, dsn = str(tmp_path / "lake"), _broken_db(make_db)
    CliRunner().invoke(participant, ["register", "--lake", lake, "--producer", "bank-a"])
    log = tmp_path / "run.log"
    proc = _run_cli(["--id", "bank-a", "--role", "producer", "--lake", lake, "--dsn", dsn,
                     "--restart-backoff-initial", "0.1", "--restart-backoff-max", "0.2"], log=log)

    def restarts() -> bool:
        assert proc.poll() is None, log.read_text()
        return log.read_text().count("restarting in") >= 3

    try:
        wait_until(restarts, timeout=120, what=f"3 restarts in {log}")
    finally:
        proc.send_signal(signal.SIGTERM)
        text = _finish(proc, log)
    delays = [x.split("restarting in ")[1].split("s ")[0] for x in text.splitlines()
              if "restarting in" in x]
    assert delays[:3] == ["0.1", "0.2", "0.2"], text
    assert proc.returncode == 4, text


def test_supervisor_backoff_resets_after_a_healthy_run(tmp_path: Path) -> None:
    """The backoff doubles per consecutive failure up to the cap, and starts again from the
    initial delay after a run that lasted ``healthy_after``; an instance that then exits 0 after
    --idle-exit is done and the supervisor exits 0. Real processes (``python -c``)."""
    counter = tmp_path / "runs"
    # runs 1-3 fail at once, run 4 fails after a "healthy" run, run 5 fails, run 6 is done
    script = ("import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); "
              "n = int(p.read_text() or 0) + 1 if p.exists() else 1; p.write_text(str(n)); "
              "print('error: run', n, file=sys.stderr); "
              "time.sleep(3.5 if n == 4 else 0); sys.exit(0 if n == 6 else 1)")
    lines: list[str] = []
    sup = Supervisor(command=[sys.executable, "-c", script, str(counter)], env=child_env(),
                     count=1, prefix="t", restart=True, idle_exit=True, backoff_initial=0.01,
                     backoff_max=0.03, healthy_after=3.0, echo=lines.append)
    assert sup.run() == 0, lines
    delays = [x.split("restarting in ")[1].split("s ")[0] for x in lines if "restarting in" in x]
    assert delays == ["0.01", "0.02", "0.03", "0.01", "0.02"], lines
    assert [code for _, code in sup.failed] == [1] * 5
    assert any(x.endswith("] error: run 3") for x in lines), lines
    assert restart_delay(10, initial=1.0, cap=60.0) == 60.0
