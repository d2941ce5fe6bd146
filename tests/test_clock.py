"""The platform clock (cues_platform/clock.py): an in-process offset, or one shared by processes
through the file CUES_CLOCK_FILE names (the time nemesis drives its children's clock that way)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform import clock
from cues_platform.errors import ConfigurationError

DAY_MS = 86_400_000
CHILD = ("import sys, time; from cues_platform import clock; "
         "print(clock.now_ms() - time.time_ns() // 1_000_000, flush=True)")


@pytest.fixture(autouse=True)
def _real_clock(monkeypatch):
    monkeypatch.delenv(clock.CLOCK_FILE_ENV, raising=False)
    clock.reset()
    yield
    monkeypatch.delenv(clock.CLOCK_FILE_ENV, raising=False)
    clock.reset()


@pytest.fixture
def shared(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "clock"
    monkeypatch.setenv(clock.CLOCK_FILE_ENV, str(path))
    return path


def child_offset_ms(path: Path) -> int:
    """The offset (platform minus real time, ms) a fresh Python process sees with the file."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                         env={**os.environ, clock.CLOCK_FILE_ENV: str(path)}, timeout=120)
    return int(out.stdout.strip())


def test_without_a_file_the_offset_is_this_process_only(tmp_path) -> None:
    before = clock.now_ms()
    clock.advance(seconds=3600)
    assert clock.now_ms() - before >= 3_600_000 and clock.offset_ms() == 3_600_000
    path = tmp_path / "never"
    assert not path.exists()  # nothing written anywhere
    assert abs(child_offset_ms(path)) < 5_000  # a child without the offset sees real time
    clock.reset()
    assert clock.offset_ms() == 0


def test_a_child_process_sees_an_advance_made_by_the_parent(shared: Path) -> None:
    assert not shared.exists() and clock.offset_ms() == 0  # no file yet: real time
    clock.advance(seconds=365 * 86_400)
    assert shared.read_text().strip() == str(365 * DAY_MS)
    seen = child_offset_ms(shared)
    assert 365 * DAY_MS - 5_000 < seen <= 365 * DAY_MS + 5_000
    clock.advance(seconds=-86_400)  # back one day: every reader again
    assert abs(child_offset_ms(shared) - 364 * DAY_MS) < 5_000
    clock.reset()
    assert shared.read_text().strip() == "0" and abs(child_offset_ms(shared)) < 5_000


def test_the_parent_sees_an_advance_made_by_a_child(shared: Path) -> None:
    clock.advance(seconds=10)
    assert clock.offset_ms() == 10_000  # read (and cached) here
    subprocess.run([sys.executable, "-c", "from cues_platform import clock; clock.advance(seconds=86400)"],
                   check=True, env={**os.environ}, timeout=120)
    assert clock.offset_ms() == 10_000 + DAY_MS


def test_rapid_advances_are_each_seen_despite_coarse_file_timestamps(shared: Path) -> None:
    # Each advance replaces the file; the cache is keyed by inode, mtime and size, and every
    # write's mtime is strictly after the previous one, so none is missed, however fast.
    for i in range(1, 301):
        clock.advance(seconds=1)
        assert clock.now_ms() - time.time_ns() // 1_000_000 >= i * 1000 - 50
        assert clock.offset_ms() == i * 1000
    leftovers = [p.name for p in shared.parent.iterdir() if p.name != shared.name]
    assert leftovers == []  # no temporary file left behind


def test_an_unchanged_file_is_not_read_again(shared: Path, monkeypatch) -> None:
    clock.advance(seconds=5)
    assert clock.offset_ms() == 5_000
    opened: list[str] = []
    real_open = open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    for _ in range(1000):
        clock.now_ms()
    assert opened == []
    clock.advance(seconds=1)
    assert clock.offset_ms() == 6_000 and opened.count(str(shared)) == 1


def test_a_file_not_written_by_the_clock_is_refused(shared: Path) -> None:
    shared.write_text("yesterday\n")
    with pytest.raises(ConfigurationError) as info:
        clock.now_ms()
    assert str(shared) in str(info.value) and clock.CLOCK_FILE_ENV in str(info.value)
    assert info.value.path == str(shared) and not info.value.retryable


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.integers(min_value=-10 * DAY_MS, max_value=10 * DAY_MS), max_size=12))
def test_the_shared_offset_is_the_sum_of_the_advances(shared: Path, steps: list[int]) -> None:
    clock.reset()
    for ms in steps:
        clock.advance(seconds=ms / 1000)
    assert clock.offset_ms() == sum(steps)
    assert int(shared.read_text()) == sum(steps)
