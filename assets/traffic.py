"""Simulated participants: an asset that posts generated traffic to ``postings`` (for trying the
deployment in the UI; in production the participants' gateways write ``postings`` themselves)."""


from datetime import datetime

from dagster import AssetExecutionContext, Config, Definitions, MaterializeResult, asset
from pydantic import Field

from cues_platform.dagster import LakeResource
from cues_platform.processing.runner import create_queues
from cues_platform.reference.generator import TrafficSpec, generate
from cues_platform.reference.pipeline import payments_graph


class TrafficConfig(Config):
    messages: int = Field(default=2_000, description="postings to generate")
    seed: int | None = Field(default=None, description="default: a new seed per materialization")
    rate: float = Field(default=0.03, description="postings per second of traffic time")
    start: str = Field(default="2026-11-20T06:00:00+00:00", description="traffic time of the first posting")
    realtime: bool = Field(default=False, description="pace the sends on the wall clock at `rate`")


@asset(group_name="simulation", kinds={"python", "delta"},
       description="Participants' gateways posting payment instructions to `postings` (generated, "
                   "realistic: malformed rows, duplicate ids, late data, producer resends).")
def participant_traffic(context: AssetExecutionContext, config: TrafficConfig, lake: LakeResource) -> MaterializeResult:
    the_lake = lake.lake()
    create_queues(payments_graph(), the_lake)
    seed = config.seed if config.seed is not None else 1 + the_lake.queue("postings").count() % 9_000
    spec = TrafficSpec(messages=config.messages, seed=seed, rate=config.rate,
                       start=datetime.fromisoformat(config.start), realtime=config.realtime)
    traffic = generate(the_lake, spec)
    counts = {k: int(v) for k, v in sorted(traffic.counts.items())}
    context.log.info(f"posted {traffic.postings} postings (seed {seed}): {counts}")
    return MaterializeResult(metadata={
        "postings": traffic.postings, "seed": seed, "sends": traffic.sends,
        "resends_absorbed": traffic.resends, "expected": counts,
        "value_dates": [d.isoformat() for d in traffic.days],
    })


defs = Definitions(assets=[participant_traffic])
