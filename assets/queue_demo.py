"""For now, one asset: the queue demo (later issues replace it with the payments pipeline)."""

from dagster import AssetExecutionContext, Definitions, MaterializeResult, asset

from resources.lake import LakeResource


@asset(kinds={"delta", "spark"}, group_name="demo")
def queue_demo(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    """Produce, resend, transact and read back the demo postings (see cues_platform.demo)."""
    from rich.console import Console

    from cues_platform.demo import run_demo

    ok = run_demo(lake_root=f"{lake.root}/demo", messages=10_000, console=Console(stderr=True))
    if not ok:
        raise RuntimeError("the queue demo's checks failed; see the run log")
    return MaterializeResult(metadata={"messages": 10_000, "checks": "passed"})


defs = Definitions(assets=[queue_demo])
