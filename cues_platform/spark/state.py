"""The state file of a daemon the ``cues spark`` commands started (``DIR/state.json``): PIDs,
ports and folder, written atomically, read back into its dataclass or refused in one line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from cues_platform.errors import CuesError

STATE = "state.json"
T = TypeVar("T")


def dir_option(default: Path, what: str):  # noqa: ANN201 - a click decorator
    """The ``--dir`` option of a ``cues spark`` command group (its state file and logs)."""
    return click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path),
                        default=default, show_default=True, help=f"The {what}'s folder: {STATE}, logs.")


grace_option = click.option("--grace", default=20.0, show_default=True,
                            help="Seconds after SIGTERM before SIGKILL.")


def read_state(folder: Path, *, parse: Callable[[dict[str, Any]], T], error: type[CuesError],
               what: str, fix: str) -> T | None:
    """``parse`` of ``folder/state.json``, or None when there is none; a damaged file is one
    ``error`` naming it, ``what`` it describes and how to ``fix`` it."""
    path = folder / STATE
    if not path.exists():
        return None
    try:
        return parse(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise error(f"the {what} state file {path} is damaged ({type(exc).__name__}: {exc}): {fix}",
                    path=str(path)) from exc


def write_state(folder: Path, data: Mapping[str, Any]) -> None:
    path = folder / STATE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


__all__ = ["STATE", "dir_option", "grace_option", "read_state", "write_state"]
