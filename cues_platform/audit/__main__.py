"""``python -m cues_platform.audit [OPTIONS]``: ``cues audit`` with its exit code guaranteed to be
the verdict (0 clean, 1 violations; see :mod:`cues_platform.audit.exit`)."""

from __future__ import annotations

import sys

from cues_platform.audit.exit import run_and_exit
from cues_platform.cli import main as cues


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    run_and_exit(lambda: cues(["audit", *args], prog_name="cues", standalone_mode=False))


if __name__ == "__main__":
    main()
