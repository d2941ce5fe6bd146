"""What the command groups of ``cues`` share: the root group's one-line errors, the ``--lake``
option (its default read from ``cues_platform.settings`` when a command runs), opening the lake
and a queue a command names, and the console."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from click.core import ParameterSource
from rich.console import Console

from cues_platform.audit.discovery import check_lake
from cues_platform.audit.storage import (
    STORAGE_ERRORS,
    first_line,
    open_checked,
    unreadable_error,
    unwritable_error,
)
from cues_platform.errors import CuesError
from cues_platform.oneline import EXIT_BAD_INPUT, EXIT_BUG, bug_hint, fail
from cues_platform.queues import Lake, Queue
from cues_platform.settings import DEFAULTS, current

console = Console()


def lake_from_settings(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--lake`` when given, else the setting ``lake`` (``$CUES_LAKE``, the settings file, or
    ``lake``), read when the command runs, never at import."""
    if ctx.get_parameter_source(param.name or "") is ParameterSource.DEFAULT:
        return current().lake
    return value


lake_option = click.option(
    "--lake",
    "lake_root",
    default=DEFAULTS.lake,
    show_default=True,
    callback=lake_from_settings,
    help="Lake root: a folder or a delta-rs URI.",
)


class CuesGroup(click.Group):
    """Every failure is one line on stderr and a non-zero exit, never a traceback: a CuesError
    (what was wrong and what to do) or a storage fault exits 2, an unexpected exception (a bug)
    exits 3 with a hint to rerun with ``CUES_DEBUG=1``, which prints the traceback too."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors and --help: click's own handling
        except CuesError as exc:
            fail(str(exc), exc, EXIT_BAD_INPUT)
        except STORAGE_ERRORS as exc:  # not translated where it was raised: still one line
            fail(f"storage error: {first_line(exc)}; check --lake, the lake's files and their "
                 "permissions (`cues audit` lists every damaged table)", exc, EXIT_BAD_INPUT)
        except Exception as exc:  # noqa: BLE001 - the last resort of a command line: one line
            fail(f"unexpected {type(exc).__name__}: {first_line(exc)} {bug_hint()}", exc, EXIT_BUG)


@contextmanager
def storage(table: str, uri: str, *, write: bool = False) -> Iterator[None]:
    """Storage faults inside the block become one error naming ``table`` and what to do."""
    try:
        yield
    except STORAGE_ERRORS as exc:
        error = unwritable_error if write else unreadable_error
        raise error(exc, table=table, uri=uri) from exc


def open_lake(lake_root: str) -> Lake:
    """The lake at ``lake_root``, which must exist and be a cues lake (else one clear error)."""
    lake = Lake(root=lake_root)
    check_lake(lake)
    return lake


def open_queue(lake_root: str, name: str) -> Queue:
    """A queue whose log and files are whole (else one error naming the table and file)."""
    return open_checked(open_lake(lake_root), name)
