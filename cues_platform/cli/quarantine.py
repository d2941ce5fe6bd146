"""``cues quarantine …``: the rows a ``contract`` or ``outside_protocol`` check holds open, and an
operator's quarantine of them.

A check's memory (``cues_platform/dagster/check_memory.py``) is the metadata of its latest
evaluation in the Dagster instance the checks ran in: the commands open that instance the way
``dagster`` does, from ``DAGSTER_HOME`` (or ``--dagster-home``), and the asset key of a queue is
its name (``--asset a/b/name`` for a prefixed key). ``list`` prints what each check holds open
(rule, partition, offsets, a sample of the rows); ``add`` quarantines rows it holds open, with a
required ``--reason`` (``check_quarantine.quarantine``: the rows are copied into the graph's
error queue and the check's next evaluation closes them); ``show`` prints what was quarantined.
Nothing here writes to the instance: the check's next evaluation (a materialization, a run of
its checks, the daemon's automation) is what turns it green.
``cues_platform/cli/root.py`` adds this group to ``cues``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cues_platform.cli.common import lake_option, open_queue
from cues_platform.errors import ConfigurationError, CuesError
from cues_platform.processing.contracts import rows_as_json
from cues_platform.queues import Queue
from cues_platform.queues.reader import read_present
from cues_platform.queues.schema import OFFSET, RESERVED
from cues_platform.settings import exported

if TYPE_CHECKING:
    from cues_platform.dagster.check_memory import CheckMemory, Runs

CHECKS = ("contract", "outside_protocol")
RULE_OUTSIDE = "no delivery hash (appended outside the protocol, not by a processor step)"
PAYLOAD_CHARS = 160
ERROR_QUEUE = "cues/error_queue"  # = check_memory.ERROR_QUEUE (that module imports dagster's package)


class NoDagsterInstanceError(ConfigurationError):
    """``DAGSTER_HOME`` (or ``--dagster-home``) is unset or names no Dagster instance. Carries
    ``dagster_home``. Not retryable: point it at the instance the checks ran in."""


class NoEvaluationError(CuesError):
    """The instance holds no evaluation of the asked checks of the asset. Carries ``asset``,
    ``checks`` and ``dagster_home``. Not retryable: run the checks first, or name the asset."""


# -- the instance and the checks' memories ----------------------------------------------------------
dagster_home_option = click.option(
    "--dagster-home", "dagster_home", envvar="DAGSTER_HOME", default=None, metavar="DIR",
    help="The Dagster instance the checks ran in (default: $DAGSTER_HOME).")
asset_option = click.option(
    "--asset", "asset", default=None, metavar="KEY",
    help="The queue's asset key, parts joined by '/' (default: the queue's name).")
check_option = click.option(
    "--check", "checks", type=click.Choice(CHECKS), multiple=True,
    help="Which check (repeatable; default: both).")
error_queue_option = click.option(
    "--error-queue", default=None, metavar="QUEUE",
    help="The error queue quarantines go to (default: the one the check's evaluation names).")


@contextmanager
def dagster_instance(home: str | None) -> Iterator[Any]:
    """The Dagster instance at ``home`` (as ``dagster`` opens ``$DAGSTER_HOME``: its dagster.yaml,
    whose values may read ``DAGSTER_HOME`` from the environment), disposed after the block."""
    from dagster import DagsterInstance

    if not home:
        raise NoDagsterInstanceError(
            "no Dagster instance: DAGSTER_HOME is not set; set it to the folder of the instance the "
            "checks ran in (the reference deployment's: export DAGSTER_HOME=$PWD/dagster_home) or "
            "pass --dagster-home DIR", dagster_home=None)
    path = Path(home).expanduser().resolve()
    if not path.is_dir():
        raise NoDagsterInstanceError(
            f"no Dagster instance at {path}: the folder does not exist; set DAGSTER_HOME (or "
            "--dagster-home) to the folder of the instance the checks ran in", dagster_home=str(path))
    if not any((path / name).exists() for name in ("dagster.yaml", "history", "storage")):
        raise NoDagsterInstanceError(
            f"no Dagster instance at {path}: it has no dagster.yaml and no storage; set DAGSTER_HOME "
            "(or --dagster-home) to the folder of the instance the checks ran in",
            dagster_home=str(path))
    with exported("DAGSTER_HOME", str(path)), DagsterInstance.from_config(str(path)) as instance:
        yield instance


def asset_key_of(queue: str, asset: str | None) -> Any:
    from dagster import AssetKey

    return AssetKey([p for p in (asset or queue).split("/") if p])


def memories(instance: Any, *, queue: str, asset: str | None, checks: Sequence[str],
             home: str | None) -> dict[str, CheckMemory]:
    """``{check: memory}`` of each asked check that has an evaluation (one at least, else
    :class:`NoEvaluationError`)."""
    from dagster import AssetCheckKey

    from cues_platform.dagster.check_memory import load_memory  # lazy: pulls in dagster (slow)

    key = asset_key_of(queue, asset)
    names = list(checks) or list(CHECKS)
    found = {name: load_memory(instance, AssetCheckKey(key, name)) for name in names}
    found = {name: mem for name, mem in found.items() if mem.run_id is not None}
    if not found:
        raise NoEvaluationError(
            f"the Dagster instance at {home} holds no evaluation of check(s) {', '.join(names)} of asset "
            f"{key.to_user_string()!r}: run them first (materialize {queue}, or execute its checks), "
            "or give --asset when the asset key has a prefix", asset=key.to_user_string(), checks=names,
            dagster_home=home)
    return found


def error_queue_of(found: dict[str, CheckMemory], given: str | None, *, queue: str) -> str:
    from cues_platform.dagster.check_quarantine import (
        QuarantineError,  # lazy: pulls in dagster (slow)
    )

    if given:
        return given
    named = sorted({str(m.evaluation.get(ERROR_QUEUE) or "") for m in found.values()} - {""})
    if len(named) == 1:
        return named[0]
    raise QuarantineError(
        f"cannot tell the error queue of {queue}: the checks' last evaluations name "
        f"{named or 'none (the graph has no error queue, or they were made by an older version)'}; "
        "pass --error-queue QUEUE (the graph's error queue)", queue=queue, partition=None, start=None, end=None)


def held_open(mem: CheckMemory) -> Runs:
    from cues_platform.dagster.check_memory import union  # lazy: pulls in dagster (slow)

    return union(mem.open_failing, mem.open_unjudged)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "?"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sample(q: Queue, runs: Runs, limit: int) -> list[str]:
    """``offset payload`` lines of the first ``limit`` rows of ``runs`` still in the queue."""
    payload = [c for c in q.payload_schema.names if c not in RESERVED]
    lines: list[str] = []
    for part, spans in sorted(runs.items()):
        first = q.start_offset(part)
        for lo, hi in spans:
            lo = max(lo, first)
            if len(lines) >= limit or lo >= hi:
                continue
            # one snapshot: a retention moving the start meanwhile only leaves fewer rows to show
            table, _ = read_present(q, partition=part, start=lo, end=min(hi, lo + limit - len(lines)),
                                    call="cues quarantine list")
            for offset, text in zip(table[OFFSET].to_pylist(), rows_as_json(table.select(payload)), strict=True):
                short = text if len(text) <= PAYLOAD_CHARS else text[:PAYLOAD_CHARS] + "…"
                lines.append(f"      {part}/{offset} {short}")
    return lines


# -- the commands ---------------------------------------------------------------------------------
@click.group("quarantine")
def quarantine_group() -> None:
    """Rows a contract or outside_protocol check holds open, and quarantining them."""


@quarantine_group.command("list")
@click.argument("queue_name", metavar="QUEUE")
@check_option
@asset_option
@error_queue_option
@click.option("-n", "samples", default=5, show_default=True, help="Sample rows shown per check.")
@dagster_home_option
@lake_option
def quarantine_list(queue_name: str, checks: tuple[str, ...], asset: str | None, error_queue: str | None,
                    samples: int, dagster_home: str | None, lake_root: str) -> None:
    """What each check of QUEUE holds open: rule, partition, offsets and sample rows."""
    from cues_platform.dagster.check_memory import (  # lazy: pulls in dagster (slow)
        count,
        describe,
        intersect,
        subtract,
    )
    from cues_platform.dagster.check_quarantine import (
        quarantined_runs,  # lazy: pulls in dagster (slow)
    )

    q = open_queue(lake_root, queue_name)
    with dagster_instance(dagster_home) as instance:
        found = memories(instance, queue=queue_name, asset=asset, checks=checks, home=dagster_home)
    errors = error_queue or next((str(m.evaluation.get(ERROR_QUEUE)) for m in found.values()
                                  if m.evaluation.get(ERROR_QUEUE)), None)
    done = quarantined_runs(q.lake, error_queue=errors, queue=queue_name) if errors else {}
    anything = False
    for name, mem in found.items():
        held = held_open(mem)
        closing = intersect(held, done)  # quarantined since that evaluation
        still = subtract(held, closing)
        head = (f"{queue_name}: {name} (last evaluation: run {mem.run_id}, {_when(mem.timestamp)}; "
                f"judged to {' '.join(f'{p}:{o}' for p, o in sorted(mem.judged_to.items())) or 'nothing'})")
        click.echo(head)
        if closing:
            click.echo(f"  quarantined since, closed at its next evaluation: {describe(closing)}")
        if not still:
            click.echo("  nothing open")
            continue
        anything = True
        click.echo(f"  holds {count(still)} row(s) open")
        if name == "contract":
            for rule, n in sorted(dict(mem.evaluation.get("failures_by_check") or {}).items()):
                click.echo(f"    rule {rule}: {n} failure(s)")
        else:
            click.echo(f"    rule {RULE_OUTSIDE}")
        unjudged = subtract(mem.open_unjudged, closing)
        failing = subtract(still, unjudged)
        for part, spans in sorted(failing.items()):
            shown = ", ".join(f"[{lo}, {hi})" for lo, hi in spans[:20])
            more = f" and {len(spans) - 20} more" if len(spans) > 20 else ""
            click.echo(f"    partition {part}: {shown}{more}")
        if unjudged:
            click.echo(f"    removed by retention before any evaluation judged them (no payload): "
                       f"{describe(unjudged)}")
        for line in _sample(q, failing, samples):
            click.echo(line)
        click.echo(f"  quarantine them: cues quarantine add {queue_name} --check {name} --all-open "
                   "--reason TEXT")
    if not anything:
        click.echo(f"{queue_name}: nothing open: no check holds a row of it")


def parse_range(text: str) -> tuple[int, int]:
    """``START:END`` (half-open) or ``OFFSET``."""
    try:
        if ":" in text:
            lo, hi = (int(x) for x in text.split(":", 1))
        else:
            lo = int(text)
            hi = lo + 1
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: give START:END (half-open, e.g. 36:40) or one OFFSET",
                                 param_hint="--offsets") from exc
    if not 0 <= lo < hi:
        raise click.BadParameter(f"{text!r}: give 0 <= START < END (half-open, e.g. 36:40)",
                                 param_hint="--offsets")
    return lo, hi


@quarantine_group.command("add")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--partition", "-p", default=None, help="The partition of --offsets.")
@click.option("--offsets", "ranges", multiple=True, metavar="START:END",
              help="Offsets to quarantine, half-open START:END or one OFFSET (repeatable).")
@click.option("--all-open", is_flag=True, help="Every row the check(s) hold open.")
@click.option("--reason", required=True, help="Why: recorded with every quarantined row.")
@check_option
@asset_option
@error_queue_option
@dagster_home_option
@lake_option
def quarantine_add(queue_name: str, partition: str | None, ranges: tuple[str, ...], all_open: bool, reason: str,
                   checks: tuple[str, ...], asset: str | None, error_queue: str | None,
                   dagster_home: str | None, lake_root: str) -> None:
    """Quarantine rows of QUEUE a check holds open (copied with the reason into the error queue;
    the check's next evaluation closes them)."""
    from cues_platform.dagster.check_memory import (  # lazy: pulls in dagster (slow)
        describe,
        normalize,
        subtract,
        union,
    )
    from cues_platform.dagster.check_quarantine import (  # lazy: pulls in dagster (slow)
        QuarantineError,
        quarantine,
    )

    if not reason.strip():
        raise click.BadParameter("give the reason in words: it is recorded with every row", param_hint="--reason")
    if all_open == bool(ranges):
        raise click.UsageError("give --all-open, or --partition P with --offsets START:END (not both)")
    if ranges and partition is None:
        raise click.UsageError("--offsets needs --partition P")
    q = open_queue(lake_root, queue_name)
    with dagster_instance(dagster_home) as instance:
        found = memories(instance, queue=queue_name, asset=asset, checks=checks, home=dagster_home)
    errors = error_queue_of(found, error_queue, queue=queue_name)
    held = union(*(held_open(m) for m in found.values()))
    if all_open:
        todo = held
    else:
        q.check_partition(str(partition))
        todo = normalize({str(partition): [list(parse_range(r)) for r in ranges]})
        outside = subtract(todo, held)
        if outside:
            first_part, ((lo, hi), *_) = next(iter(sorted(outside.items())))
            raise QuarantineError(
                f"offsets {describe(outside)} of {queue_name} are not held open by check(s) "
                f"{', '.join(found)} (they hold: {describe(held) or 'nothing'}): quarantine only what a "
                f"check holds open (`cues quarantine list {queue_name}`); rows that arrived after its last "
                "evaluation are judged at the next one, run the check first",
                queue=queue_name, partition=first_part, start=lo, end=hi)
    if not todo:
        click.echo(f"{queue_name}: nothing open: nothing quarantined")
        return
    written = sum(quarantine(q.lake, error_queue=errors, queue=queue_name, partition=part, start=lo, end=hi,
                             reason=reason.strip())
                  for part, spans in todo.items() for lo, hi in spans)
    if not written:
        click.echo(f"{queue_name}: {describe(todo)} were quarantined before: nothing written")
        return
    click.echo(f"{queue_name}: quarantined {describe(todo)} into {errors} ({written} error row(s)); "
               f"the next evaluation of {', '.join(found)} closes them")


@quarantine_group.command("show")
@click.argument("queue_name", metavar="QUEUE")
@asset_option
@error_queue_option
@dagster_home_option
@lake_option
def quarantine_show(queue_name: str, asset: str | None, error_queue: str | None, dagster_home: str | None,
                    lake_root: str) -> None:
    """What was quarantined of QUEUE: partition, offsets, when, the reason."""
    from cues_platform.dagster.check_quarantine import (
        quarantine_records,  # lazy: pulls in dagster (slow)
    )

    q = open_queue(lake_root, queue_name)
    if error_queue is None:
        with dagster_instance(dagster_home) as instance:
            found = memories(instance, queue=queue_name, asset=asset, checks=(), home=dagster_home)
        error_queue = error_queue_of(found, None, queue=queue_name)
    open_queue(lake_root, error_queue)
    records = quarantine_records(q.lake, error_queue=error_queue, queue=queue_name)
    if not records:
        click.echo(f"{queue_name}: nothing quarantined in {error_queue}")
        return
    for r in records:
        kind = "acknowledged, no payload" if not r["payload"] else str(r["exception_type"])
        when = r["failed_at"].strftime("%Y-%m-%d %H:%M:%S UTC") if r["failed_at"] is not None else "?"
        click.echo(f"{queue_name} {r['partition']} [{r['start']}, {r['end']}) {r['rows']} row(s) {when} "
                   f"({kind}): {r['message']}")


__all__ = ["NoDagsterInstanceError", "NoEvaluationError", "quarantine_group"]
