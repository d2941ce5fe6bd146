"""``python -m cues_platform.jepsen --seed N --duration S``: the harness, as ``cues jepsen``."""

from cues_platform.jepsen.cli import jepsen

if __name__ == "__main__":
    jepsen(prog_name="python -m cues_platform.jepsen")
