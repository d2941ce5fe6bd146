"""The Dagster layer: a graph's processors as assets, resources, IO manager, sensors, checks.

Nothing below this package imports Dagster; this is a thin adapter over the library.
See docs/dagster.md.
"""

from cues_platform.dagster.assets import (
    BACKING_KEY,
    IO_MANAGER_KEY,
    LAKE_KEY,
    SPARK_KEY,
    InjectedFailure,
    ProcessorRunConfig,
    build_processor_asset,
    external_queues,
    processor_keys,
    queue_key,
)
from cues_platform.dagster.checks import CONTRACT, EXACTLY_ONCE, build_checks, validate_contract
from cues_platform.dagster.definitions import all_job_name, build_definitions, schedule_name
from cues_platform.dagster.function_assets import processor_asset
from cues_platform.dagster.io_manager import PARTITION_COLUMN, CuesIOManager
from cues_platform.dagster.maintenance import (
    MAINTENANCE_JOB,
    MaintenanceConfig,
    build_maintenance_definitions,
)
from cues_platform.dagster.resources import BackingQueueResource, CuesSparkResource, LakeResource
from cues_platform.dagster.sensors import (
    RECOVERY_ATTEMPT_TAG,
    RECOVERY_OF_TAG,
    build_new_data_sensor,
    build_recovery_sensor,
    new_data_run_key,
)
from cues_platform.dagster.step_io import STEP_IO_KEY, CuesStepIOManager

__all__ = [
    "BACKING_KEY", "CONTRACT", "EXACTLY_ONCE", "IO_MANAGER_KEY", "LAKE_KEY", "PARTITION_COLUMN",
    "RECOVERY_ATTEMPT_TAG", "RECOVERY_OF_TAG", "SPARK_KEY", "BackingQueueResource", "CuesIOManager",
    "CuesSparkResource", "InjectedFailure", "LakeResource", "ProcessorRunConfig", "all_job_name",
    "build_checks", "build_definitions", "build_new_data_sensor", "build_processor_asset",
    "build_recovery_sensor", "external_queues", "new_data_run_key", "processor_keys", "queue_key",
    "schedule_name", "validate_contract", "STEP_IO_KEY", "CuesStepIOManager", "processor_asset",
    "MAINTENANCE_JOB", "MaintenanceConfig", "build_maintenance_definitions",
]
