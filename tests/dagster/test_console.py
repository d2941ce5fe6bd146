"""What a person sees in the terminal of the deployment (issue 25, item 7): run events at INFO
(the deployment's dagster.yaml), and no JVM start-up warning per run (the driver JVM's stderr
comes through ``forward_jvm_stderr``). Counted in real processes: the ``dagster`` command line,
``java`` and a Spark start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from cues_platform.spark.session import forward_jvm_stderr
from tests.support import ROOT

DAGSTER = str(Path(sys.executable).parent / "dagster")
INSTANCE_YAML = ROOT / "dagster_home" / "dagster.yaml"

DEFS = textwrap.dedent('''
    from dagster import Definitions, asset

    @asset
    def first(context):
        context.log.info("first says hello")
        return 1

    @asset
    def second(context, first):
        context.log.info("second says hello")
        return first + 1

    defs = Definitions(assets=[first, second])
''')


def _materialize(tmp: Path, name: str, yaml_text: str) -> list[str]:
    """The console lines of ``dagster asset materialize`` of two assets on an instance whose
    dagster.yaml is ``yaml_text``."""
    home = tmp / name
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml_text)
    defs = tmp / "defs_two.py"
    defs.write_text(DEFS)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    proc = subprocess.run([DAGSTER, "asset", "materialize", "-f", str(defs), "--select", "*"],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (proc.stdout + proc.stderr).splitlines()


def test_the_deployment_instance_prints_run_events_at_info(tmp_path: Path) -> None:
    """The same two-asset run, on the deployment's dagster.yaml and on the same file without its
    ``python_logs`` block (Dagster's default): the first prints no DEBUG event and far fewer
    lines, and still the user's INFO lines (a failure is an ERROR event: still printed)."""
    deployment = INSTANCE_YAML.read_text()
    assert "python_log_level: INFO" in deployment
    default = deployment.replace("python_logs:\n  python_log_level: INFO\n", "")
    assert default != deployment
    quiet = _materialize(tmp_path, "deployment", deployment)
    loud = _materialize(tmp_path, "default", default)
    debug = [line for line in loud if " - DEBUG - " in line]
    assert len(debug) >= 10, loud  # STEP_START, LOADED_INPUT, HANDLED_OUTPUT, ... of each step
    assert not [line for line in quiet if " - DEBUG - " in line], quiet
    assert len(quiet) <= len(loud) - len(debug)
    for text in ("first says hello", "second says hello"):
        assert any(text in line for line in quiet), (text, quiet)
    print(f"dagster asset materialize, 2 assets: {len(loud)} lines with Dagster's default, "
          f"{len(quiet)} with the deployment's dagster.yaml")


def test_jvm_stderr_is_forwarded_without_the_incubator_warning(tmp_path: Path) -> None:
    """A real JVM started as Spark's launcher starts the driver (``--add-modules
    jdk.incubator.vector``): its stderr reaches the target whole, except the warning line."""
    java = shutil.which("java")
    assert java is not None, "Spark's tests need java on PATH"
    out = tmp_path / "stderr.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen([java, "--add-modules=jdk.incubator.vector", "-version"],
                                stderr=subprocess.PIPE)
        forward_jvm_stderr(proc.stderr, to_fd=sink.fileno()).join(timeout=60)
        assert proc.wait(timeout=60) == 0
    raw = subprocess.run([java, "--add-modules=jdk.incubator.vector", "-version"],
                         capture_output=True, text=True, timeout=60).stderr.splitlines()
    assert any(line.startswith("WARNING: Using incubator modules") for line in raw), raw
    forwarded = out.read_text().splitlines()
    assert forwarded == [line for line in raw if not line.startswith("WARNING: Using incubator")]
    assert any("version" in line for line in forwarded)


def test_a_spark_start_prints_no_jvm_warning(run_python) -> None:
    """A process that starts the platform's Spark session, runs a job and stops prints nothing
    on stderr: no incubator warning, no Spark banner."""
    proc = run_python(textwrap.dedent('''
        from cues_platform.spark import get_spark
        spark = get_spark()
        assert spark.range(5).count() == 5
        spark.stop()
    '''), timeout=300)
    assert "incubator" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
