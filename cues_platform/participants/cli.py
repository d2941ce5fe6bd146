"""``cues participant ...``: register, migrate, post, run (x instances), check, status, history.

The main CLI registers this group with one line:
``main.add_command(participant)`` after ``from cues_platform.participants.cli import participant``.
It also runs on its own: ``python -m cues_platform.participants.cli``.

Exit codes: 0 ok; 1 ``check`` found issues or problems; 2 bad input, settings or state (a
``CuesError``, one line); 3 an unexpected exception (one line; ``CUES_DEBUG=1`` adds the
traceback); 4 ``run``: an instance failed and was not restarted (``--no-restart``), or was still
failing when the run was stopped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click
import psycopg
from click.core import ParameterSource

from cues_platform.errors import CuesError
from cues_platform.oneline import EXIT_BAD_INPUT, EXIT_BUG, bug_hint, exception_line, fail
from cues_platform.participants.checks import check_consumer, check_producer
from cues_platform.participants.config import CONFIG_ENV, field_types, to_env
from cues_platform.participants.db import (
    Database,
    connect_existing,
    participant_dsn,
    schema_version,
)
from cues_platform.participants.errors import MissingDatabaseError, UnknownParticipantError
from cues_platform.participants.history import history as build
from cues_platform.participants.history import render
from cues_platform.participants.model import Role, Settings
from cues_platform.participants.network import register as reg
from cues_platform.participants.network import registered_roles, require, validate_participant
from cues_platform.participants.postings import Posting, post_many
from cues_platform.participants.supervise import Supervisor
from cues_platform.queues import Lake
from cues_platform.settings import DEFAULTS, child_environment, current
from cues_platform.signals import StopSignals


def _lake_from_settings(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--lake`` when given, else the setting ``lake`` (``$CUES_LAKE``, the settings file, or
    ``lake``: ``cues_platform/settings.py``), read when the command runs."""
    if ctx.get_parameter_source(param.name or "") is ParameterSource.DEFAULT:
        return current().lake
    return value


class _Group(click.Group):
    """Every failure is one line on stderr: a CuesError exits 2, anything else 3 (a bug; the
    traceback only with ``CUES_DEBUG=1``), as ``cues`` does (``cues_platform/cli/common.py``)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except CuesError as exc:
            fail(str(exc), exc, EXIT_BAD_INPUT)
        except Exception as exc:  # noqa: BLE001 - the last resort of a command line: one line
            fail(f"unexpected {exception_line(exc)} {bug_hint()}", exc, EXIT_BUG)


lake_option = click.option("--lake", "lake_root", default=DEFAULTS.lake, show_default=True,
                           callback=_lake_from_settings,
                           help="Lake root: a folder or a delta-rs URI.")
id_option = click.option("--id", "participant", required=True,
                         help="Participant id: lowercase letter, then [a-z0-9_-], <= 64 chars.")
dsn_option = click.option("--dsn", default=None,
                          help="PostgreSQL DSN of this participant's database (default: embedded "
                               "pgserver under --data-dir). Never logged.")
data_dir_option = click.option("--data-dir", default=".cues/participants", show_default=True,
                               help="Where the embedded PostgreSQL lives (one database per "
                                    "participant).")

SETTING_HELP = {
    "max_payload_bytes": "Largest payload accepted (bytes).",
    "publish_attempts": "Publish attempts of one publication before bailing.",
    "publish_timeout": "Seconds of publish retries before bailing (keep below --lease-seconds).",
    "backoff_initial": "First wait between publish retries (s); doubles with jitter.",
    "backoff_max": "Longest wait between publish retries (s).",
    "lease_seconds": "Lease of a slot / the consumer (s); a dead holder is replaced after it.",
    "batch_size": "Postings per publication (one POSTINGS commit).",
    "results_batch": "Results applied per transaction.",
    "replay_after": "Replay acked postings without a result after this many seconds.",
    "idle_poll": "First wait when idle (s); doubles up to --max-idle-poll.",
    "max_idle_poll": "Longest wait when idle (s).",
    "consumer_batch": "Postings per consumer step.",
    "restart_backoff_initial": "run: first wait before restarting a failed instance (s).",
    "restart_backoff_max": "run: longest wait before restarting a failed instance (s).",
    "restart_healthy_after": "run: an instance that ran this long restarts without backoff (s).",
}


def settings_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--config FILE`` and one ``--<field>`` option per ``model.Settings`` field."""
    for name, typ in reversed(list(field_types(Settings).items())):
        click_type = {int: click.INT, float: click.FLOAT, bool: click.BOOL}.get(typ, click.STRING)
        fn = click.option(f"--{name.replace('_', '-')}", f"setting_{name}", type=click_type,
                          default=None, help=SETTING_HELP.get(name, f"model.Settings.{name}"))(fn)
    return click.option("--config", "config", default=None, type=click.Path(dir_okay=False),
                        help=f"TOML file of settings (keys: model.Settings fields; default "
                             f"${CONFIG_ENV}). Precedence: defaults < file < "
                             "CUES_PARTICIPANT_* < options.")(fn)


def _settings(config: str | None, options: dict[str, Any]) -> Settings:
    overrides = {k.removeprefix("setting_"): options.pop(k) for k in list(options)
                 if k.startswith("setting_")}
    return Settings.load(config=config, overrides=overrides)


def _dsn(participant: str, dsn: str | None, data_dir: str) -> str:
    return participant_dsn(participant, dsn=dsn or current().postgres_dsn or None, data_dir=data_dir)


def _existing(participant: str, dsn: str | None, data_dir: str) -> psycopg.Connection:
    return connect_existing(participant, dsn=dsn or current().postgres_dsn or None, data_dir=data_dir)


@click.group(cls=_Group)
def participant() -> None:
    """Postings protocol participants (seed 002): each with its own PostgreSQL."""


@participant.command()
@lake_option
@click.option("--producer", "producers", multiple=True, help="Register a producer (sender).")
@click.option("--consumer", "consumers", multiple=True, help="Register a consumer (receiver).")
def register(lake_root: str, producers: tuple[str, ...], consumers: tuple[str, ...]) -> None:
    """Declare participants: POSTINGS/RESULTS subjects for them (idempotent)."""
    reg(Lake(root=lake_root), producers=producers, consumers=consumers)
    click.echo(f"registered producers={list(producers)} consumers={list(consumers)}")


@participant.command()
@id_option
@dsn_option
@data_dir_option
def migrate(participant: str, dsn: str | None, data_dir: str) -> None:
    """Apply the missing schema migrations to the participant's database."""
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
@settings_options
def post(participant: str, lake_root: str, dsn: str | None, data_dir: str, receiver: str,
         count: int, payload: str, prefix: str | None, jsonl: click.File | None,
         config: str | None, **options: Any) -> None:
    """Record postings (nacked_posting, PENDING): the running instances publish them."""
    import uuid

    validate_participant(receiver)  # before the sender's database is created or touched
    settings = _settings(config, options)
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
                  settings=settings)
    click.echo(f"recorded {n} posting(s)")


@participant.command()
@id_option
@click.option("--role", type=click.Choice([r.value for r in Role]), required=True)
@click.option("--instances", default=1, show_default=True, help="Independent instances (processes).")
@click.option("--slots", default=1, show_default=True, type=click.IntRange(min=1),
              help="Publishing slots to create (one is enough on one POSTINGS table: its commits "
                   "take turns; more only add contention); existing slots are never removed: any "
                   "live instance drains them.")
@lake_option
@dsn_option
@data_dir_option
@click.option("--idle-exit", type=float, default=None, help="Stop after this many idle seconds.")
@click.option("--restart/--no-restart", default=True, show_default=True,
              help="Restart an instance that dies (with backoff: --restart-backoff-*).")
@settings_options
def run(participant: str, role: str, instances: int, slots: int, lake_root: str,
        dsn: str | None, data_dir: str, idle_exit: float | None, restart: bool,
        config: str | None, **options: Any) -> None:
    """Run X independent instances of a participant (one process each) until SIGTERM/Ctrl-C.

    Each instance's stderr is forwarded prefixed with ``[instance NAME]``; a failed instance is
    reported in one line with its exit code and last error line. Exit 0 when every instance ended
    cleanly, 4 when one failed and was not restarted (or still failed when stopped)."""
    validate_participant(participant)
    settings = _settings(config, options)
    require(Lake(root=lake_root), participant, role)
    resolved = _dsn(participant, dsn, data_dir)  # starts the embedded server once, here
    env = child_environment({**to_env(settings),  # the instances read them with Settings.from_env
                             "CUES_POSTGRES_DSN": resolved}, without=(CONFIG_ENV,))
    command = [sys.executable, "-m", "cues_platform.participants.instance", "--id", participant,
               "--role", role, "--lake", lake_root, "--slots", str(slots)]
    if idle_exit is not None:
        command += ["--idle-exit", str(idle_exit)]
    sup = Supervisor(command=command, env=env, count=instances, prefix=participant,
                     restart=restart, idle_exit=idle_exit is not None,
                     backoff_initial=settings.restart_backoff_initial,
                     backoff_max=settings.restart_backoff_max,
                     healthy_after=settings.restart_healthy_after,
                     echo=lambda line: click.echo(line, err=True))
    click.echo(f"{participant} ({role}): {instances} instance(s) running", err=True)
    with StopSignals(lambda _signum: sup.stop()):
        code = sup.run()
    if sup.failed:
        click.echo(f"{participant} ({role}): {len(sup.failed)} instance failure(s): "
                   + ", ".join(f"{name} exit {c}" for name, c in sup.failed[-10:]), err=True)
    sys.exit(code)


def _roles(lake_root: str, participant: str, role: str | None) -> list[Role]:
    if role is not None:
        return [Role(role)]
    roles = registered_roles(Lake(root=lake_root), participant)
    if not roles:
        raise UnknownParticipantError(
            f"participant {participant} is registered in no role in the lake {lake_root}; pass "
            "the right --lake, or --role producer|consumer", participant=participant)
    return roles


@participant.command()
@id_option
@lake_option
@dsn_option
@data_dir_option
@click.option("--role", type=click.Choice([r.value for r in Role]), default=None,
              help="Check this role (default: every role the participant is registered for in "
                   "--lake).")
@click.option("--complete", is_flag=True, help="Also require every posting to have its result.")
@click.option("--json", "as_json", is_flag=True)
def check(participant: str, lake_root: str, dsn: str | None, data_dir: str, role: str | None,
          complete: bool, as_json: bool) -> None:
    """Consistency issues (exit 1 if any) and, with --complete, completeness. Read only."""
    validate_participant(participant)
    roles = _roles(lake_root, participant, role)
    with _existing(participant, dsn, data_dir) as conn:
        reports = {r.value: (check_producer(conn, participant, complete=complete)
                             if r is Role.PRODUCER
                             else check_consumer(conn, participant, complete=complete,
                                                 lake=Lake(root=lake_root)))
                   for r in roles}
    passed = all(rep.passed for rep in reports.values())
    if as_json:
        click.echo(json.dumps({"participant": participant, "passed": passed, "roles": {
            name: {"passed": rep.passed, "counts": rep.counts, "problems": rep.problems,
                   "issues": rep.issues} for name, rep in reports.items()}},
            default=str, indent=2))
    else:
        for name, report in reports.items():
            click.echo(f"{participant} ({name}): {report.counts}")
            for issue in report.issues:
                click.echo(f"issue {issue['kind']}: sender={issue['sender']} "
                           f"message_id={issue['message_id']} {issue['detail']}")
            for problem in report.problems[:50]:
                click.echo(f"problem: {problem}")
    sys.exit(0 if passed else 1)


@participant.command()
@id_option
@dsn_option
@data_dir_option
@click.option("--json", "as_json", is_flag=True)
def status(participant: str, dsn: str | None, data_dir: str, as_json: bool) -> None:
    """Counts by status of the participant's database (read only; creates nothing)."""
    with _existing(participant, dsn, data_dir) as conn:
        out = {"participant": participant, "schema_version": schema_version(conn),
               "messages": {f"{a}/{p}": int(n) for a, p, n in conn.execute(
                   "SELECT ack_status, processing_status, count(*) FROM messages "
                   "GROUP BY 1, 2 ORDER BY 1, 2")},
               "received": {s: int(n) for s, n in conn.execute(
                   "SELECT status, count(*) FROM received GROUP BY 1 ORDER BY 1")},
               "consistency_issues": int(conn.execute(
                   "SELECT count(*) FROM consistency_issues").fetchone()[0])}
    if as_json:
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(" ".join(f"{k}={v}" for k, v in out.items()))


@participant.command()
@id_option
@click.option("--message-id", required=True, help="The posting's message id (ids are per sender).")
@click.option("--lake", "lake_root", default=None,
              help="Also show the posting's POSTINGS/RESULTS rows with offsets (scans the two "
                   "subjects).")
@dsn_option
@data_dir_option
@click.option("--receiver", default=None,
              help="Receiver to look at when the sender has no row for the message.")
@click.option("--receiver-dsn", envvar="CUES_RECEIVER_DSN", default=None,
              help="DSN of the receiver's database (default: embedded under --data-dir).")
@click.option("--json", "as_json", is_flag=True)
def history(participant: str, message_id: str, lake_root: str | None, dsn: str | None,
            data_dir: str, receiver: str | None, receiver_dsn: str | None, as_json: bool) -> None:
    """A posting's whole life across the sender's (--id) and the receiver's databases: statuses,
    replays, retries, publications, audit rows, consistency issues, the receiver's row. Read only."""
    from contextlib import ExitStack

    validate_participant(participant)
    if receiver is not None:
        validate_participant(receiver)
    with ExitStack() as stack:
        sender_conn = stack.enter_context(_existing(participant, dsn, data_dir))
        row = sender_conn.execute("SELECT receiver FROM messages WHERE sender = %s AND "
                                  "message_id = %s", (participant, message_id)).fetchone()
        target = row[0] if row else receiver
        receiver_conn, note = None, None
        if target is not None:
            try:
                receiver_conn = stack.enter_context(_existing(target, receiver_dsn, data_dir))
            except MissingDatabaseError as exc:
                note = f"receiver side not shown: {exc}"
        h = build(sender_conn=sender_conn, sender=participant, message_id=message_id,
                  receiver_conn=receiver_conn, receiver=target,
                  lake=Lake(root=lake_root) if lake_root else None)
        if note:
            h.notes.append(note)
    if as_json:
        click.echo(json.dumps(h.as_dict(), default=str, indent=2))
    else:
        for line in render(h):
            click.echo(line)


def main() -> None:  # pragma: no cover - ``python -m cues_platform.participants.cli``
    participant()


if __name__ == "__main__":  # pragma: no cover
    main()

