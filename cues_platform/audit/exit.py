"""``cues audit``'s exit code is its verdict: 0 clean, 1 violations, whatever native threads do.

Why a hard exit. Every Delta scan of delta-rs (``DeltaTable.to_pyarrow_dataset``) reads its files
through a ``pyarrow.fs.PyFileSystem`` over delta-rs' object store: Arrow's C++ I/O threads call
back into Python for every read, so each read needs the GIL. When a scan fails on a damaged file
(a garbled Parquet footer: the audit reports it as [unreadable] and goes on), Arrow stops the scan
but reads it had already queued for the other files keep running on its I/O thread pool. If one
of them asks for the GIL while the interpreter finalizes, CPython ends that thread with
``pthread_exit``, whose forced unwinding crosses a ``noexcept`` C++ frame of Arrow's thread pool:
``std::terminate``, "terminate called without an active exception", SIGABRT, exit code 134,
after the report was printed. Measured: 5 of 60 audits of lakes with garbled data files (one
of them a segfault, 139; issue 22 item 7 saw 2 of ~14); 0 of 76 audits of lakes whose damage
fails before any scan; with the hard exit, 0 of 72 (32 in a loop, 40 in two runs of the test).

The audit writes nothing: once its report is printed and flushed there is nothing left for the
interpreter's finalization to do but tear those threads down. So the command ends with
:func:`exit_with`: flush stdout and stderr, then ``os._exit(code)``, which skips finalization and
therefore the crash. It does so only when it owns the process (its ``sys.stdout`` is the
process's own): inside click's ``CliRunner`` or pytest's capture it raises ``SystemExit`` as
before, so an in-process caller is never killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def owns_process() -> bool:
    """True when the standard streams are the process's own (a real ``cues`` process), not a
    test runner's or an embedding application's replacements."""
    return sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__


def exit_with(code: int) -> NoReturn:
    """End the command with ``code``: flushed, then ``os._exit`` (see the module docstring) when
    this is the process's entry point, else ``SystemExit(code)``."""
    if not owns_process():
        raise SystemExit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: the verdict stands
            stream.flush()
    os._exit(code)


def run_and_exit(command: Callable[[], int | None]) -> NoReturn:
    """Run ``command`` (its return value, or the code of the ``SystemExit`` it raises, is the exit
    code) and end the process with :func:`exit_with`. An exception escaping it is printed as
    Python would and ends with code 1."""
    try:
        code = command()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130  # what a shell reports for SIGINT
    except BaseException:  # noqa: BLE001 - printed like Python's own handler, then the hard exit
        import traceback

        traceback.print_exc()
        code = 1
    exit_with(int(code or 0))


__all__ = ["exit_with", "owns_process", "run_and_exit"]
