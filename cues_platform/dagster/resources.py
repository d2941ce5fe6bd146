"""Dagster resources of the platform: the lake, Spark, and processors' backing queues.

Every field has a local default, so ``build_definitions(graph)`` runs with zero set-up; each is
configurable in the launchpad / run config, and every one can come from the environment with
:class:`dagster.EnvVar` (``LakeResource(root=EnvVar("CUES_LAKE"))``), which Dagster resolves at
run time and never stores in run config; a field left unset is read from
``cues_platform.settings`` when the run uses it (never when the code location is loaded). Secrets for object stores go through
``secret_options_env`` (delta-rs option -> environment variable name): they are read in the run
process and never appear in Dagster's storage or UI.
"""

from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from cues_platform.errors import ConfigurationError
from cues_platform.processing.backing import BackingQueue
from cues_platform.processing.phased import PhasedStep
from cues_platform.queues import Lake
from cues_platform.settings import current, secret
from cues_platform.spark.session import SparkSettings, get_spark

LAKE_ENV = "CUES_LAKE"
SPARK_MASTER_ENV = "CUES_SPARK_MASTER"
ROOT_SETTINGS = ("lake", "participants_lake")


class LakeResource(ConfigurableResource):
    """Where the queues live: a local folder or any delta-rs URI (``s3://``, ``abfss://``, ``gs://``).

    ``root`` unset means the setting ``root_setting`` read in the run process (``lake``:
    ``$CUES_LAKE`` or ``./lake``). ``storage_options`` go to delta-rs unchanged
    (region, endpoint, ...); ``secret_options_env`` maps a delta-rs option to the *name* of an
    environment variable holding its value (``{"AWS_SECRET_ACCESS_KEY": "LAKE_SECRET"}``).
    """

    root: str | None = Field(default=None, description="lake root; default: the setting root_setting")
    root_setting: str = Field(
        default="lake", description="the setting (cues_platform.settings) that gives the root when "
        "root is unset: lake ($CUES_LAKE or ./lake) or participants_lake")
    storage_options: dict[str, str] = Field(default_factory=dict,
                                            description="delta-rs storage options (non-secret)")
    secret_options_env: dict[str, str] = Field(
        default_factory=dict, description="delta-rs option -> name of the env var that holds it")

    def resolved_root(self) -> str:
        if self.root:
            return self.root
        if self.root_setting not in ROOT_SETTINGS:
            raise ConfigurationError(
                f"LakeResource.root_setting is {self.root_setting!r}: set it to one of "
                f"{', '.join(ROOT_SETTINGS)} (or set root)", root_setting=self.root_setting)
        return getattr(current(), self.root_setting)

    def lake(self) -> Lake:
        options = dict(self.storage_options)
        for option, env in self.secret_options_env.items():
            value = secret(env)  # read here, in the run process; never logged
            if value is None:
                raise ConfigurationError(
                    f"lake storage option {option!r} comes from environment variable {env!r}, "
                    "which is not set in this process", option=option, env=env)
            options[option] = value
        return Lake(root=self.resolved_root(), storage_options=options or None)


class CuesSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy Spark resource with the platform's session defaults.

    ``master``: ``local[*]`` (default, or ``$CUES_SPARK_MASTER``), a cluster master
    (``spark://host:7077``, ``yarn``, ``k8s://...``) or a Spark Connect URL (``sc://host:15002``).
    ``spark_config`` is added to the session's configuration. The session is created on first
    use and shared by everything in the run process (``getOrCreate``): one session per process,
    never stopped by Dagster (a test's or an application's session is reused, not replaced).
    """

    spark_config: dict[str, Any] = Field(default_factory=dict)
    master: str | None = Field(default=None,
                               description="local[*], spark://..., yarn, k8s://... or sc://...")
    app_name: str = "cues_platform"

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def settings(self) -> SparkSettings:
        master = self.master or current().spark_master
        conf = {k: str(v) for k, v in self.spark_config.items()}
        return SparkSettings(master=master, app_name=self.app_name, conf=conf)

    def _init_session(self) -> None:
        if self._spark_session is None:
            self._spark_session = get_spark(self.settings())


class BackingQueueResource(ConfigurableResource):
    """Processors' backing queues (snapshots and attempts) in the lake of ``lake``."""

    lake: LakeResource
    _cache: dict = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._cache = {}

    def backing(self, processor_id: str) -> BackingQueue:
        if processor_id not in self._cache:
            self._cache[processor_id] = BackingQueue(self.lake.lake(), processor_id)
        return self._cache[processor_id]

    def open_step(self, *, graph: Any, processor: Any, spark: Any, hook: Any = None) -> Any:
        """A :class:`~cues_platform.processing.phased.PhasedStep` of ``processor`` (not started):
        its stepper keeps the processor's snapshots and attempts in its backing queue (exactly
        once) or its positions (the other strategies). Used by the step IO manager."""
        return PhasedStep.create(graph=graph, processor=processor, lake=self.lake.lake(), spark=spark,
                                 hook=hook, backing_of=self.backing)

    def describe_last(self, processor_id: str) -> dict[str, Any]:
        """The last backing record in words: what recovery will find (empty dict: no record)."""
        return describe_record(self.backing(processor_id).last_record())


def describe_record(record: Any) -> dict[str, Any]:
    if record is None:
        return {}
    ranges = {b: f"{r.queue}/{r.partition} [{r.start}, {r.end})" for b, r in record.snapshot.inputs.items()}
    body: dict[str, Any] = {"type": record.type.value, "step": record.step, "epoch": record.epoch,
                            "delivery_hash": record.hash, "inputs": ranges, "offset": record.offset}
    if record.error:
        body["error"] = record.error
    if record.outputs.get("rows"):
        body["rows"] = record.outputs["rows"]
    return body


def spark_session_of(resource: Any) -> Any:
    """The Spark session of a resource: dagster-pyspark's (``.spark_session``) or a bare session."""
    session = getattr(resource, "spark_session", None)
    return session if session is not None else resource
