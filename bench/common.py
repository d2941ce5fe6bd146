"""Small shared helpers for the benchmarks: machine description, statistics, timing, JSON output.

Kept dependency-free (standard library only) so every benchmark script can import it with
``from common import ...`` when run as ``python bench/<script>.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

# -- machine -------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or "unknown")


def _ram_gib() -> float | None:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s*(\d+) kB", text, re.MULTILINE)
    return round(int(match.group(1)) / 1024 / 1024, 1) if match else None


def _java_version() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return " / ".join(line.strip() for line in lines[:2]) if lines else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def machine_info(packages: Sequence[str] = ("deltalake", "pyspark", "pyarrow", "numpy")) -> dict:
    """What the numbers were measured on: CPU, cores, RAM, OS, Python, Java and package versions."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": _java_version(),
        "packages": {p: _version(p) for p in packages},
        "git_commit": _git_commit(),
    }


def machine_markdown(info: dict) -> str:
    """The machine description as a Markdown bullet list (for docs/benchmarks.md)."""
    pkgs = ", ".join(f"{k} {v}" for k, v in info.get("packages", {}).items())
    return "\n".join(
        [
            f"- CPU: {info['cpu_model']}, {info['cpu_cores']} cores",
            f"- RAM: {info['ram_gib']} GiB",
            f"- OS: {info['os']}",
            f"- Python {info['python']}; Java: {info['java']}",
            f"- Packages: {pkgs}",
        ]
    )


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * p / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return float(data[lo] + (data[hi] - data[lo]) * (rank - lo))


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def summarize(seconds: Sequence[float], *, digits: int = 6) -> dict:
    """n, median, p50, p90, p99, min, max and mean of a list of durations (seconds)."""
    r = lambda x: round(float(x), digits)  # noqa: E731
    return {
        "n": len(seconds),
        "median_s": r(median(seconds)),
        "p50_s": r(percentile(seconds, 50)),
        "p90_s": r(percentile(seconds, 90)),
        "p99_s": r(percentile(seconds, 99)),
        "min_s": r(min(seconds)),
        "max_s": r(max(seconds)),
        "mean_s": r(sum(seconds) / len(seconds)),
    }


# -- timing --------------------------------------------------------------------------------------


def time_runs(fn: Callable[[], Any], runs: int, *, warmup: int = 0) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``runs`` times; return the durations."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


class Profiler:
    """Accumulate wall time spent in chosen functions by wrapping them for a while.

    ``with prof.patch((module_or_class, "attr", "label"), ...):`` replaces each attribute with a
    timing wrapper and restores it afterwards. Nested wrapped calls are counted in both labels.
    Used only on separate profiling runs, never on the timed ones.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def _wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t0
                self.calls[label] = self.calls.get(label, 0) + 1

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    @contextlib.contextmanager
    def patch(self, *targets: tuple[Any, str, str]) -> Iterator[Profiler]:
        saved = []
        try:
            for owner, attr, label in targets:
                original = owner.__dict__[attr] if attr in vars(owner) else getattr(owner, attr)
                saved.append((owner, attr, original))
                setattr(owner, attr, self._wrap(getattr(owner, attr), label))
            yield self
        finally:
            for owner, attr, original in reversed(saved):
                setattr(owner, attr, original)

    def per_call_ms(self, divisor: int) -> dict[str, float]:
        """Milliseconds per measured operation (total time / ``divisor``) for each label."""
        return {k: round(v * 1000 / divisor, 3) for k, v in sorted(self.seconds.items())}


# -- output --------------------------------------------------------------------------------------


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def write_json(path: str | os.PathLike[str], payload: Any) -> Path:
    """Write ``payload`` as indented, key-stable JSON (atomically: temp file + rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, target)
    return target
