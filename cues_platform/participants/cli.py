"""``cues participant ...``: register, migrate, post, run (x instances), status, check.

The main CLI registers this group with one line:
``main.add_command(participant)`` after ``from cues_platform.participants.cli import participant``.
It also runs on its own: ``python -m cues_platform.participants.cli``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import click
import psycopg

from cues_platform.errors import CuesError
from cues_platform.participants.model import Role, Settings

DEFAULT_LAKE = os.environ.get("CUES_LAKE", "lake")


class _Group(click.Group):
    """Every CuesError becomes one clear line and exit code 2."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except CuesError as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            sys.exit(2)


lake_option = click.option("--lake", "lake_root", default=DEFAULT_LAKE, show_default=True,
                           envvar="CUES_LAKE", help="Lake root: a folder or a delta-rs URI.")
id_option = click.option("--id", "participant", required=True, help="Participant id.")
dsn_option = click.option("--dsn", envvar="CUES_POSTGRES_DSN", default=None,
                          help="PostgreSQL DSN of this participant's database (default: embedded "
                               "pgserver under --data-dir). Never logged.")
data_dir_option = click.option("--data-dir", default=".cues/participants", show_default=True,
                               help="Where the embedded PostgreSQL lives (one database per "
                                    "participant).")


def _dsn(participant: str, dsn: str | None, data_dir: str) -> str:
    from cues_platform.participants.db import participant_dsn

    return participant_dsn(participant, dsn=dsn, data_dir=data_dir)


@click.group(cls=_Group)
def participant() -> None:
    """Postings protocol participants (seed 002): each with its own PostgreSQL."""


@participant.command()
@lake_option
@click.option("--producer", "producers", multiple=True, help="Register a producer (sender).")
@click.option("--consumer", "consumers", multiple=True, help="Register a consumer (receiver).")
def register(lake_root: str, producers: tuple[str, ...], consumers: tuple[str, ...]) -> None:
    """Declare participants: POSTINGS/RESULTS subjects for them (idempotent)."""
    from cues_platform.participants.network import register as reg
    from cues_platform.queues import Lake

    reg(Lake(root=lake_root), producers=producers, consumers=consumers)
    click.echo(f"registered producers={list(producers)} consumers={list(consumers)}")


@participant.command()
@id_option
@dsn_option
@data_dir_option
def migrate(participant: str, dsn: str | None, data_dir: str) -> None:
    """Apply the missing schema migrations to the participant's database."""
    from cues_platform.participants.db import Database

    applied = Database(_dsn(participant, dsn, data_dir)).migrate()
    click.echo(f"applied migrations {applied}" if applied else "schema is up to date")


@participant.command()
@id_option
@lake_option
@dsn_option
@data_dir_option
@click.option("--to", "receiver", required=True, help="Receiving participant.")
@click.option("--count", default=1, show_default=True, help="Postings to record.")
@click.option("--payload", default='{"amount": 1}', show_default=True, help="Payload text.")
@click.option("--prefix", default=None, help="Message id prefix (default: random).")
@click.option("--jsonl", type=click.File("r"), default=None,
              help="Read postings from JSON lines {receiver, message_id, payload} instead.")
def post(participant: str, lake_root: str, dsn: str | None, data_dir: str, receiver: str,
         count: int, payload: str, prefix: str | None, jsonl: click.File | None) -> None:
    """Record postings (nacked_posting, PENDING): the running instances publish them."""
    from cues_platform.participants.db import Database
    from cues_platform.participants.producer import Posting, post_many
    from cues_platform.queues import Lake

    db = Database(_dsn(participant, dsn, data_dir))
    db.migrate()
    if jsonl is not None:
        rows = [json.loads(line) for line in jsonl if line.strip()]  # type: ignore[attr-defined]
        postings = [Posting(r.get("receiver", receiver), r["message_id"], r.get("payload"))
                    for r in rows]
    else:
        prefix = prefix or uuid.uuid4().hex[:8]
        postings = [Posting(receiver, f"{prefix}-{i:08d}", payload) for i in range(count)]
    n = post_many(db, Lake(root=lake_root), sender=participant, postings=postings,
                  settings=Settings.from_env())
    click.echo(f"recorded {n} posting(s)")


@participant.command()
@id_option
@click.option("--role", type=click.Choice([r.value for r in Role]), required=True)
@click.option("--instances", default=1, show_default=True, help="Independent instances (processes).")
@click.option("--slots", default=None, type=int, help="Publishing slots (default: --instances).")
@lake_option
@dsn_option
@data_dir_option
@click.option("--idle-exit", type=float, default=None, help="Stop after this many idle seconds.")
@click.option("--restart/--no-restart", default=True, show_default=True,
              help="Restart an instance that dies.")
def run(participant: str, role: str, instances: int, slots: int | None, lake_root: str,
        dsn: str | None, data_dir: str, idle_exit: float | None, restart: bool) -> None:
    """Run X independent instances of a participant (one process each) until SIGTERM/Ctrl-C."""
    from cues_platform.participants.network import require
    from cues_platform.queues import Lake

    require(Lake(root=lake_root), participant, role)
    resolved = _dsn(participant, dsn, data_dir)  # starts the embedded server once, here
    env = {**os.environ, "CUES_POSTGRES_DSN": resolved}
    base = [sys.executable, "-m", "cues_platform.participants.instance", "--id", participant,
            "--role", role, "--lake", lake_root, "--slots", str(slots or instances)]
    if idle_exit is not None:
        base += ["--idle-exit", str(idle_exit)]
    procs: dict[int, subprocess.Popen] = {}
    stopping = False

    def spawn(i: int) -> None:
        procs[i] = subprocess.Popen([*base, "--instance", f"{participant}-{i}-{uuid.uuid4().hex[:6]}"],
                                    env=env)

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(instances):
        spawn(i)
    click.echo(f"{participant} ({role}): {instances} instance(s) running", err=True)
    while procs:
        for i, p in list(procs.items()):
            code = p.poll()
            if code is None:
                continue
            if stopping or not restart or (code == 0 and idle_exit is not None):
                del procs[i]
            else:
                click.echo(f"instance {i} exited with {code}; restarting", err=True)
                spawn(i)
        time.sleep(0.2)


@participant.command()
@id_option
@dsn_option
@data_dir_option
@click.option("--complete", is_flag=True, help="Also require every posting to have its result.")
@click.option("--json", "as_json", is_flag=True)
def check(participant: str, dsn: str | None, data_dir: str, complete: bool, as_json: bool) -> None:
    """Consistency issues (exit 1 if any) and, with --complete, completeness of a producer."""
    from cues_platform.participants.checks import check_producer

    with psycopg.connect(_dsn(participant, dsn, data_dir)) as conn:
        report = check_producer(conn, participant, complete=complete)
    if as_json:
        click.echo(json.dumps({"participant": participant, "passed": report.passed,
                               "counts": report.counts, "problems": report.problems,
                               "issues": report.issues}, default=str, indent=2))
    else:
        click.echo(f"{participant}: {report.counts}")
        for issue in report.issues:
            click.echo(f"issue {issue['kind']}: sender={issue['sender']} "
                       f"message_id={issue['message_id']} {issue['detail']}")
        for problem in report.problems[:50]:
            click.echo(f"problem: {problem}")
    sys.exit(0 if report.passed else 1)


def main() -> None:  # pragma: no cover - ``python -m cues_platform.participants.cli``
    participant()


if __name__ == "__main__":  # pragma: no cover
    main()

