"""The clean lake (built once per test session) and private copies of it to corrupt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cues_platform.processing import GraphRunner
from cues_platform.processing.loader import load_graph
from cues_platform.queues import Lake
from tests.audit.lakes import seed, write_graph


@pytest.fixture(scope="session")
def clean_lake(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake after GraphRunner ran the test graph until idle (built once per test session)."""
    base = tmp_path_factory.mktemp("audit")
    graph = load_graph(f"{write_graph(base)}:graph")
    lake = Lake(root=str(base / "lake"))
    seed(graph, lake)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    return base / "lake"


@pytest.fixture
def lake_copy(clean_lake: Path, tmp_path: Path) -> Lake:
    """A private copy of the clean lake, to corrupt."""
    shutil.copytree(clean_lake, tmp_path / "lake")
    return Lake(root=str(tmp_path / "lake"))


