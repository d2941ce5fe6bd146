"""One-line errors for every command line of the platform (``cues``, ``cues participant``, the
participant instance processes).

A user's mistake (a :class:`~cues_platform.errors.CuesError`) is one line on stderr and exit 2;
anything else is a bug: one line naming it and exit 3. The traceback is printed only with
``CUES_DEBUG=1``.
"""

from __future__ import annotations

import sys
import traceback
from typing import NoReturn

import click

from cues_platform.settings import SettingError, current

DEBUG_ENV = "CUES_DEBUG"
EXIT_BAD_INPUT = 2  # a CuesError, or a storage fault: the input, the settings or the lake must change
EXIT_BUG = 3  # an unexpected exception: a bug to report


def debugging() -> bool:
    """``CUES_DEBUG`` is set. False when the settings themselves are bad: the error being reported
    is then (or follows) that SettingError, which names the variable; it is printed either way."""
    try:
        return current().debug
    except SettingError:
        return False


def bug_hint() -> str:
    return f"(a bug in cues_platform: rerun with {DEBUG_ENV}=1 for the traceback and report it)"


def exception_line(exc: BaseException) -> str:
    """``Type: message`` on one line (the message's whitespace folded)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def fail(message: str, exc: BaseException, code: int) -> NoReturn:
    """Print ``error: <message>`` as one unwrapped line (the traceback first when debugging) and
    exit with ``code``. Plain ``click.echo``, not rich: brackets such as "[70, 80)" in messages
    are not taken for markup."""
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(code)
