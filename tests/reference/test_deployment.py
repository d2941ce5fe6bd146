"""The main job's Dagster engine refuses, in one line, what it cannot run (the whole job runs in
``tests/docs/test_docs_examples.py::test_cues_demo_then_a_day_again``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cues_platform.errors import ConfigurationError
from cues_platform.reference.deployment import dagster_home, load_definitions
from tests.support import ROOT


def test_outside_the_project_folder_the_demo_says_where_to_run_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(ConfigurationError, match=r"no definitions.py in .*--engine runner"):
        load_definitions(tmp_path)
    with pytest.raises(ConfigurationError, match=r"no Dagster instance at .*set DAGSTER_HOME"):
        dagster_home(tmp_path)


def test_the_project_instance_is_the_default_and_dagster_home_wins(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert dagster_home(ROOT) == (ROOT / "dagster_home").resolve()
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert dagster_home(ROOT) == tmp_path.resolve()
