"""Issue 10 item 6: ``cues participant history`` shows a posting's whole life across the sender's
and the receiver's databases and the queues; and the documented operating commands run as printed."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

from cues_platform.participants.cli import participant
from cues_platform.participants.consumer import ConsumerInstance
from cues_platform.participants.db import MIGRATIONS
from cues_platform.participants.model import RESULTS, RESULTS_SCHEMA, Settings
from cues_platform.participants.network import register
from cues_platform.participants.postings import Posting, post_many
from cues_platform.participants.producer import ProducerInstance
from cues_platform.pgserver_db import stop_embedded_postgres
from cues_platform.queues import Lake
from tests.docs.conftest import make_workspace, run_printed, shell_env
from tests.docs.examples import OPERATING_COMMANDS, command

FAST = Settings(lease_seconds=3, replay_after=0.0, idle_poll=0.01, batch_size=50)


def history(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(participant, ["history", *args])
    return out.exit_code, out.output


def test_history_across_both_databases_and_the_queues(lake: Lake, make_db: Callable[[str], str],
                                                      spark: object, tmp_path: Path) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_a, dsn_x = make_db("bank-a"), make_db("bank-x")
    prod = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn_a, instance_id="a1",
                            slots=2, settings=FAST)
    prod.start()
    post_many(prod.db, lake, sender="bank-a", postings=[
        Posting("bank-x", f"m{i}", json.dumps({"amount": i})) for i in range(3)])
    while prod.tick():
        pass
    prod2 = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn_a, instance_id="a2",
                             slots=2, settings=FAST)
    prod2.start()  # takes slot 1, start-up replay (replay_after = 0): every posting again
    while prod2.tick():
        pass
    cons = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x1",
                            settings=FAST, spark=spark)
    cons.start()
    while cons.tick():
        pass
    lake.queue(RESULTS).append(pa.table(  # a result for a message bank-a never sent
        {"sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["ghost"], "replays": [0],
         "status": ["OK"], "reason": [None], "processed_at": [None]}, schema=RESULTS_SCHEMA),
        partition="bank-a")
    while prod.tick() or prod2.tick():
        pass
    for inst in (prod, prod2, cons):
        inst.close()
    common = ["--dsn", dsn_a, "--receiver-dsn", dsn_x]
    code, out = history("--id", "bank-a", "--message-id", "m1", "--lake", lake.root, "--json",
                        *common)
    assert code == 0, out
    h = json.loads(out)
    assert (h["posting"]["ack_status"], h["posting"]["processing_status"],
            h["posting"]["replays"]) == ("acked_result", "OK", 1)
    assert [(r["db"], r["action"]) for r in h["timeline"] if r["db"] == "bank-a"] == [
        ("bank-a", a) for a in ("recorded", "assigned", "posting_acked", "replay", "replay_acked",
                                "result_received")]
    assert [r["action"] for r in h["timeline"] if r["db"] == "bank-x"] == [
        "processed", "replay_suppressed"]
    assert [r["at"] for r in h["timeline"]] == sorted(r["at"] for r in h["timeline"])
    assert [(p["kind"], p["replays"]) for p in h["publications"]] == [("posting", 0),
                                                                      ("replay", 1)]
    assert all(p["acked_at"] for p in h["publications"])
    assert (h["received"]["status"], h["received"]["routed"]) == ("OK", True)
    assert h["issues"] == []
    postings_rows, results_rows = h["queues"]["postings"], h["queues"]["results"]
    assert [r["replays"] for r in postings_rows] == [0, 1]
    assert postings_rows[0]["_offset"] == h["posting"]["posting_offset"]
    assert [(r["status"], r["receiver"]) for r in results_rows] == [("OK", "bank-x")]
    code, text = history("--id", "bank-a", "--message-id", "m1", *common)
    assert code == 0 and text.startswith("bank-a/m1 -> bank-x: acked_result/OK replays=1"), text
    assert "received by bank-x: OK" in text and "consistency issues: 0" in text, text
    # the result for a message bank-a never sent: its history is the stored issue
    code, out = history("--id", "bank-a", "--message-id", "ghost", "--json", *common)
    assert code == 0, out
    ghost = json.loads(out)
    assert ghost["posting"] is None and [i["kind"] for i in ghost["issues"]] == ["unknown_message"]
    # unknown message id: one line, exit 2
    code, out = history("--id", "bank-a", "--message-id", "nope", *common)
    assert code == 2 and out.startswith("error: no posting 'nope' from bank-a") and \
        out.count("\n") == 1, out
    # the receiver's database is not reachable the default way: said, sender side shown
    code, text = history("--id", "bank-a", "--message-id", "m1", "--dsn", dsn_a, "--data-dir",
                         str(tmp_path / "none"))
    assert code == 0 and "note: receiver side not shown: participant bank-x has no database" in text
    assert "result_received" in text


def test_operating_commands_as_printed() -> None:
    """docs/postings-protocol.md, "Operating participants": OPERATING_COMMANDS as printed, in a
    fresh workspace with the embedded PostgreSQL."""
    base = Path(tempfile.mkdtemp(prefix="cues-docs-ops-"))
    ws = make_workspace(base / "ws")
    env = shell_env()
    try:
        out = {}
        for key in OPERATING_COMMANDS:
            out[key] = run_printed(command("docs/postings-protocol.md", key), ws, timeout=300,
                                   env=env)
        *_, status, check, hist = (out[k].stdout for k in OPERATING_COMMANDS)
        newest = max(v for v, _, _ in MIGRATIONS)
        assert status.startswith(f"participant=bank-b schema_version={newest} messages="), status
        assert check.startswith("bank-b (producer): "), check
        assert hist.startswith("bank-b/doc-00000003 -> bank-y: "), hist
        assert "note: receiver side not shown: participant bank-y has no database" in hist
    finally:
        if (ws / ".cues" / "participants" / "pg").exists():
            stop_embedded_postgres(ws / ".cues" / "participants" / "pg")
        shutil.rmtree(base, ignore_errors=True)
