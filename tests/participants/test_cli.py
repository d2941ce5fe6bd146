"""``cues participant``: register, migrate, post (clear errors on bad input), check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

from cues_platform.participants.cli import participant
from cues_platform.participants.db import MIGRATIONS, Database
from cues_platform.participants.model import RESULTS, RESULTS_SCHEMA
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake


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
    good = cli.invoke(participant, ["check", "--id", "bank-a", "--dsn", dsn])
    assert good.exit_code == 0, good.output
    # a result for an unknown message fails the check
    Lake(root=lake).queue(RESULTS).append(pa.table(
        {"sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["ghost"], "replays": [0],
         "status": ["OK"], "reason": [None], "processed_at": [None]}, schema=RESULTS_SCHEMA),
        partition="bank-a")
    inst = ProducerInstance(participant="bank-a", lake=Lake(root=lake), dsn=dsn, instance_id="t")
    inst.start()
    inst.apply_results_once()
    bad = cli.invoke(participant, ["check", "--id", "bank-a", "--dsn", dsn])
    assert bad.exit_code == 1 and "issue unknown_message" in bad.output and "ghost" in bad.output
    inst.close()
    Database(dsn).close()


def test_cli_run_spawns_instances(tmp_path: Path, make_db: Callable[[str], str]) -> None:
    """``participant run --instances 2``: two processes publish the recorded postings."""
    import os
    import subprocess
    import sys

    from tests.support import ROOT

    lake, dsn = str(tmp_path / "lake"), make_db("bank-a")
    cli = CliRunner()
    cli.invoke(participant, ["register", "--lake", lake, "--producer", "bank-a",
                             "--consumer", "bank-x"])
    out = cli.invoke(participant, ["post", "--id", "bank-a", "--lake", lake, "--dsn", dsn,
                                   "--to", "bank-x", "--count", "40", "--prefix", "r"])
    assert out.exit_code == 0, out.output
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUES_PARTICIPANT_BATCH_SIZE": "10"}
    proc = subprocess.run(
        [sys.executable, "-m", "cues_platform.participants.cli", "run", "--id", "bank-a",
         "--role", "producer", "--instances", "2", "--lake", lake, "--dsn", dsn,
         "--idle-exit", "1.5", "--no-restart"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    stats = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(stats) == 2
    db = Database(dsn)
    assert db.run(lambda c: c.execute(
        "SELECT ack_status, count(*) FROM messages GROUP BY 1").fetchall()) == [
        ("acked_posting", 40)]
    assert Lake(root=lake).queue("postings").read_arrow(partition="bank-x").num_rows == 40
    db.close()
