"""Fixtures for the pipe tests: a fresh logical clock and simulation per test."""

from __future__ import annotations

import pytest

from cues_platform.pipes import Clock, Simulation


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sim(clock: Clock) -> Simulation:
    return Simulation(clock)
