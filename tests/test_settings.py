"""The platform's one settings place (``cues_platform/settings.py``): precedence, errors that say
what to do, secrets kept out of reprs, nothing read at import time, no other module reading the
environment, and docs/settings.md generated from the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cues_platform import settings
from cues_platform.cli import main
from cues_platform.dagster.resources import LakeResource
from cues_platform.errors import ConfigurationError, CuesError
from cues_platform.settings import (
    DEFAULTS,
    SPECS,
    SettingError,
    command_line,
    current,
    load,
)
from tests.support import ROOT

PROJECT_CODE = ("cues_platform", "assets", "resources")


def test_precedence_is_default_then_file_then_environment_then_command_line(tmp_path: Path) -> None:
    config = tmp_path / "cues.toml"
    config.write_text('lake = "from-file"\nspark_master = "spark://file:7077"\n'
                      'postgres_dir = "file-pg"\n')
    env = {"CUES_LAKE": "from-env", "CUES_SPARK_MASTER": "spark://env:7077",
           "CUES_CONFIG": str(config)}
    s = load(env=env, command_line={"lake": "from-cli", "spark_master": None})
    assert s.lake == "from-cli"  # command line over environment
    assert s.spark_master == "spark://env:7077"  # environment over file (None: not given)
    assert s.postgres_dir == "file-pg"  # file over default
    assert s.spark_log_level == DEFAULTS.spark_log_level == "ERROR"  # default
    assert load(env={}).lake == "lake"
    assert load(env={"CUES_LAKE": ""}).lake == "lake"  # an empty variable counts as unset


def test_the_process_settings_follow_the_environment_and_the_command_line_layer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "cues.toml"
    config.write_text('lake = "file-lake"\n')
    monkeypatch.delenv("CUES_LAKE", raising=False)
    monkeypatch.setenv("CUES_CONFIG", str(config))
    first = current()
    assert first.lake == "file-lake"
    loads = settings.loads
    assert current() is first and settings.loads == loads  # built once while nothing changes
    monkeypatch.setenv("CUES_LAKE", "env-lake")
    assert current().lake == "env-lake"
    # what `cues demo --lake X` does: the Dagster deployment in the same process opens X
    with command_line(lake=str(tmp_path / "cli-lake")):
        assert LakeResource().resolved_root() == str(tmp_path / "cli-lake")
    assert LakeResource().resolved_root() == "env-lake"
    assert LakeResource(root_setting="participants_lake").resolved_root() == "lake-participants"


def test_a_bad_value_names_the_variable_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SettingError) as caught:
        load(env={"CUES_SPARK_LOG_LEVEL": "LOUD"})
    err = caught.value
    assert isinstance(err, ConfigurationError) and isinstance(err, CuesError)
    assert not err.retryable
    assert err.variable == "CUES_SPARK_LOG_LEVEL" and err.source == "environment variable"
    assert "bad value 'LOUD' for CUES_SPARK_LOG_LEVEL" in str(err)
    assert "one of ALL, DEBUG" in str(err) and "set CUES_SPARK_LOG_LEVEL to" in str(err)
    assert load(env={"CUES_LOG_LEVEL": "info"}).log_level == "INFO"  # any case

    bad_file = tmp_path / "cues.toml"
    bad_file.write_text('laek = "typo"\n')
    with pytest.raises(SettingError, match=r"unknown setting 'laek' in config file .*known: "):
        load(env={"CUES_CONFIG": str(bad_file)})
    with pytest.raises(SettingError, match=r"cannot read the settings config file .*unset CUES_CONFIG"):
        load(env={"CUES_CONFIG": str(tmp_path / "missing.toml")})
    bad_file.write_text("lake = 3\n")
    with pytest.raises(SettingError, match=r"bad value 3 for CUES_LAKE \(config file .*expected text"):
        load(env={"CUES_CONFIG": str(bad_file)})

    # on the command line: one line, exit 2, naming the variable
    result = CliRunner().invoke(main, ["queue", "ls"], env={"CUES_SPARK_LOG_LEVEL": "LOUD"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [line for line in lines if line.startswith("error: ")] and len(lines) == 1
    assert "CUES_SPARK_LOG_LEVEL" in lines[0]
    # and when the command's own error is reported while the settings are bad
    result = CliRunner().invoke(main, ["queue", "ls", "--lake", str(tmp_path / "nothing")],
                                env={"CUES_DEBUG": "1", "CUES_SPARK_LOG_LEVEL": "LOUD"})
    assert result.exit_code == 2 and result.output.startswith("error: no lake at"), result.output


def test_the_sensor_interval_is_whole_seconds_from_the_environment_or_the_file(tmp_path: Path) -> None:
    assert load(env={}).sensor_interval == 30
    assert load(env={"CUES_SENSOR_INTERVAL": " 5 "}).sensor_interval == 5
    assert load(env={"CUES_SENSOR_INTERVAL": ""}).sensor_interval == 30  # empty: unset
    toml = tmp_path / "cues.toml"
    toml.write_text("sensor_interval = 7\n")
    assert load(env={"CUES_CONFIG": str(toml)}).sensor_interval == 7
    for bad in ("0", "-5", "2.5", "soon"):
        with pytest.raises(SettingError, match=rf"bad value '{bad}' for CUES_SENSOR_INTERVAL .*whole number of "
                                               r"seconds, at least 1; set CUES_SENSOR_INTERVAL to") as caught:
            load(env={"CUES_SENSOR_INTERVAL": bad})
        assert caught.value.variable == "CUES_SENSOR_INTERVAL"
    toml.write_text("sensor_interval = true\n")
    with pytest.raises(SettingError, match="expected text"):
        load(env={"CUES_CONFIG": str(toml)})


def test_a_secret_never_reaches_a_repr_or_an_error() -> None:
    s = load(env={"CUES_POSTGRES_DSN": "postgresql://u:hunter2@db/x"})
    assert s.postgres_dsn == "postgresql://u:hunter2@db/x"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)
    secret_spec = next(spec for spec in SPECS if spec.env == "CUES_POSTGRES_DSN")
    assert secret_spec.secret
    with pytest.raises(SettingError) as caught:
        settings.parse(secret_spec, 42, source="config file x")
    assert "42" not in str(caught.value) and "<secret>" in str(caught.value)


_PROBE = r"""
import importlib, json, os, pkgutil, sys
from pathlib import Path

ROOT = Path(sys.argv[1])
CODE = tuple(str(ROOT / name) + os.sep for name in ("cues_platform", "assets", "resources"))
reads = []

class Recording(type(os.environ)):
    def _note(self, key):
        frame = sys._getframe(2)
        while frame is not None and not frame.f_code.co_filename.startswith(CODE):
            if not frame.f_code.co_filename.endswith(
                    ("os.py", "_collections_abc.py", "<frozen os>", "<frozen _collections_abc>")):
                return  # a library reading its own variables
            frame = frame.f_back
        if frame is not None:
            reads.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {key}")

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

old = os.environ
os.environ = Recording(old._data, old.encodekey, old.decodekey, old.encodevalue, old.decodevalue)

import cues_platform
names = ["resources"] + [
    m.name for m in pkgutil.walk_packages(cues_platform.__path__, "cues_platform.")
    if not m.name.endswith("__main__")]
names += [f"resources.{p.stem}" for p in (ROOT / "resources").glob("*.py") if p.stem != "__init__"]
for name in names:
    importlib.import_module(name)
from cues_platform import settings
print(json.dumps({"modules": len(names), "reads": reads, "loads": settings.loads}))
"""


@pytest.mark.slow
def test_importing_every_module_reads_no_setting(tmp_path: Path) -> None:
    """Every module of the package (and the deployment's resources/) is imported in a process
    whose every setting variable holds a bad value and whose CUES_CONFIG names no file: any
    settings read at import time would fail the import. The process's os.environ also records
    every read made from the project's code (there must be none) and the settings count their
    loads (there must be none). ``assets/`` is the one exception by design: a Dagster code
    location's participants are its definitions, read (through the settings) when it loads."""
    poisoned = {spec.env: "@not-valid@" for spec in SPECS if spec.env.startswith("CUES_")}
    poisoned["CUES_CONFIG"] = str(tmp_path / "no-such-settings.toml")
    env = {**settings.child_environment(), **poisoned, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["modules"] > 100  # the walk found the package, not an empty path
    assert out["reads"] == []
    assert out["loads"] == 0


def test_no_module_but_settings_reads_the_environment() -> None:
    """The one place: no ``os.environ``/``getenv``/``environ`` anywhere else in the project's
    code (a child's environment is ``settings.child_environment``, a write ``settings.export``)."""
    pattern = re.compile(r"\bos\.environ\b|\bgetenv\b|\bfrom os import .*environ")
    found = []
    for top in PROJECT_CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "cues_platform" / "settings.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_docs_settings_md_is_generated_from_the_code() -> None:
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert doc == settings.document(), (
        "docs/settings.md is stale: run `python -m cues_platform.settings > docs/settings.md`")
    for spec in SPECS:  # every setting has its row
        assert f"| `{spec.name}` | `{spec.env}` |" in doc
