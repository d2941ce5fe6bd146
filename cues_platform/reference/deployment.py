"""The main job as Dagster runs: the deployment's own job on the project's persistent instance.

``cues demo`` (engine ``dagster``, the default) loads the code location the UI serves
(``definitions.py`` of the project, which merges ``assets/`` and ``resources/``), and executes, in
this process and on the instance of ``$DAGSTER_HOME`` (default: the project's ``dagster_home/``):

1. the job ``payments__all`` (every processor asset and its checks), again until a run moves no
   queue (the ``fx`` source publishes a fixing only when ``convert`` waits for one);
2. ``settlement_report`` for each value date of the traffic (one partition each).

So ``dagster dev`` afterwards shows those runs, their materializations and check results, and the
report's partitions, against the same lake (``$CUES_LAKE`` or ``./lake``) and ledger. A failed run
raises :class:`MaterializationFailedError` with its run id (the failure is in the instance and in
the UI): nothing is retried behind the user's back.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from cues_platform.errors import ConfigurationError, CuesError
from cues_platform.settings import current, export

JOB_NAME = "payments__all"
REPORT_ASSET = "settlement_report"
MAX_RUNS = 20
DEFAULT_HOME = "dagster_home"
DEFINITIONS_FILE = "definitions.py"


class MaterializationFailedError(CuesError):
    """A Dagster run of the main job failed; ``run_id`` names it (see it in the UI). Running the
    demo again may succeed: every run starts with recovery."""

    retryable = True


# the runs' events go to the instance (and the UI); the console shows warnings and errors only
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _offsets(lake: Any, graph: Any) -> dict[str, dict[str, int]]:
    """Every queue's end offsets: what a run that moved messages changes (Delta versions also move
    with each run's fencing commits, which carry no message)."""
    return {q: lake.queue(q).end_offsets() for q in graph.queues}


def dagster_home(project: Path) -> Path:
    """``$DAGSTER_HOME``, else the project's ``dagster_home/`` (which holds its ``dagster.yaml``)."""
    home = Path(current().dagster_home or project / DEFAULT_HOME).resolve()
    if not (home / "dagster.yaml").is_file():
        raise ConfigurationError(f"no Dagster instance at {home} (no dagster.yaml): run the demo from the "
                                 f"project folder, or set DAGSTER_HOME to an instance's folder")
    return home


def load_definitions(project: Path) -> Any:
    """The code location of ``project/definitions.py`` (its ``defs``), imported as the UI does."""
    path = project / DEFINITIONS_FILE
    if not path.is_file():
        raise ConfigurationError(f"no {DEFINITIONS_FILE} in {project}: run the demo from the project folder "
                                 "(the one holding definitions.py, assets/ and resources/), or use --engine runner")
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))  # definitions.py imports the project's assets/ and resources/
    spec = importlib.util.spec_from_file_location("cues_deployment_definitions", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.defs


def run_main_job(*, project: Path, lake: Any, graph: Any, days: Sequence[date], console: Any,
                 max_runs: int = MAX_RUNS) -> list[str]:
    """Steps 1-2 of the module docstring; returns the run ids, in order."""
    from dagster import AssetKey, DagsterInstance, DynamicPartitionsDefinition

    home = dagster_home(project)
    defs = load_definitions(project)
    runs: list[str] = []
    export("DAGSTER_HOME", str(home))  # the instance's dagster.yaml reads it (storage base_dir)
    with DagsterInstance.from_config(str(home)) as instance:

        def execute(job: Any, what: str, **kwargs: Any) -> None:
            with console.status(f"dagster: {what} (instance {home}) ..."):
                result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET,
                                                tags={"cues/trigger": "demo"}, **kwargs)
            runs.append(result.run_id)
            if not result.success:
                raise MaterializationFailedError(
                    f"run {result.run_id} ({what}) failed; its error is in the log above and in the Dagster "
                    f"UI (DAGSTER_HOME={home})", run_id=result.run_id)

        # Step 1
        job = defs.resolve_job_def(JOB_NAME)
        for n in range(1, max_runs + 1):
            before = _offsets(lake, graph)
            execute(job, f"run {n} of job {JOB_NAME}")
            if _offsets(lake, graph) == before:  # no message moved (a run's fences commit nothing readable)
                break
        # Step 2: the report's days are dynamic partitions (assets/settlement.py): add the demo's
        pdef = defs.resolve_assets_def(AssetKey(REPORT_ASSET)).partitions_def
        if isinstance(pdef, DynamicPartitionsDefinition):
            keys = [d.isoformat() for d in days]
            instance.add_dynamic_partitions(
                pdef.name, [k for k in keys if not instance.has_dynamic_partition(pdef.name, k)])
        report_job = defs.resolve_implicit_global_asset_job_def()
        for day in days:
            execute(report_job, f"{REPORT_ASSET} for {day.isoformat()}", asset_selection=[AssetKey(REPORT_ASSET)],
                    partition_key=day.isoformat())
    console.print(f"dagster: {len(runs)} runs recorded in {home} (see them with `dagster dev`)")
    return runs
