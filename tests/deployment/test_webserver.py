"""Webserver smoke test: the project's workspace served by a real ``dagster-webserver``; asset nodes
over GraphQL; runs launched over GraphQL (simulated traffic, then the job ``payments__all``)
polled to SUCCESS; then the lake is audited clean and every posting landed exactly once; a day of
the settlement report launched and re-executed as from the UI gives the same rows, never doubled.

Each run is a separate process that starts its own Spark: the data is tiny (40 postings)."""

from __future__ import annotations

import time
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable

from cues_platform.audit import audit
from cues_platform.pgserver_db import dsn_from_env
from cues_platform.queues import Lake
from cues_platform.reference.job import reconcile
from cues_platform.reference.ledger import LedgerDB, totals
from cues_platform.reference.pipeline import payments_graph
from tests.deployment.support import LOCATION, DeploymentTestError, Webserver

PROCESSOR_ASSETS = {"fx_rates", "instructions", "parsed", "priced", "results", "ledger_entries",
                    "malformed", "ledger"}
RUN_TIMEOUT = 420.0

ADD_PARTITION = """
mutation($r: RepositorySelector!, $n: String!, $k: String!) {
  addDynamicPartition(repositorySelector: $r, partitionsDefName: $n, partitionKey: $k) { __typename }
}
"""
LAUNCH = """
mutation($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on RunConfigValidationInvalid { errors { message path } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on PipelineNotFoundError { message }
  }
}"""
RUN = """query($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } } }"""


def launch(server: Webserver, job: str, *, assets: list[str] | None = None, run_config: dict | None = None) -> str:
    selector: dict[str, Any] = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                                "jobName": job}
    if assets:
        selector["assetSelection"] = [{"path": [a]} for a in assets]
    out = server.graphql(LAUNCH, {"executionParams": {"selector": selector, "runConfigData": run_config or {}}})
    result = out["launchRun"]
    if result["__typename"] != "LaunchRunSuccess":
        raise DeploymentTestError(f"launchRun failed: {result}")
    return result["run"]["runId"]


def wait_for(server: Webserver, run_id: str) -> str:
    """Poll the run's status until it is finished (bounded); its final status."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        status = server.graphql(RUN, {"runId": run_id})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        if time.monotonic() > deadline:
            raise DeploymentTestError(f"run {run_id} still {status} after {RUN_TIMEOUT}s:\n{server.tail()}")
        time.sleep(1.0)


def run_failure(server: Webserver, run_id: str) -> str:
    q = """query($runId: ID!) { logsForRun(runId: $runId) { __typename ... on EventConnection {
             events { __typename ... on MessageEvent { message } } } } }"""
    events = server.graphql(q, {"runId": run_id})["logsForRun"].get("events", [])
    return "\n".join(e.get("message", "") for e in events[-30:])


def test_asset_nodes_over_graphql(webserver: Webserver) -> None:
    data = webserver.graphql("{ assetNodes { assetKey { path } groupName isPartitioned } }")
    nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
    assert PROCESSOR_ASSETS | {"postings", "settlement_report", "participant_traffic"} <= set(nodes)
    assert {nodes[k]["groupName"] for k in PROCESSOR_ASSETS} == {"payments"}
    assert nodes["settlement_report"]["isPartitioned"]
    repo = webserver.graphql("""{ repositoriesOrError { ... on RepositoryConnection { nodes {
        name jobs { name } sensors { name } schedules { name } } } } }""")["repositoriesOrError"]["nodes"][0]
    assert "payments__all" in {j["name"] for j in repo["jobs"]}
    assert "payments__schedule" in {s["name"] for s in repo["schedules"]}
    assert "payments__recovery" in {s["name"] for s in repo["sensors"]}


def test_launch_runs_over_graphql_then_audit(webserver: Webserver) -> None:
    traffic = launch(webserver, "__ASSET_JOB", assets=["participant_traffic"],
                     run_config={"ops": {"participant_traffic": {"config": {"messages": 40, "seed": 5}}}})
    status = wait_for(webserver, traffic)
    assert status == "SUCCESS", run_failure(webserver, traffic)
    lake = Lake(root=webserver.lake_root)
    assert lake.queue("postings").count() == 40

    run_id = launch(webserver, "payments__all")
    status = wait_for(webserver, run_id)
    assert status == "SUCCESS", run_failure(webserver, run_id)

    report = audit(lake, graph=payments_graph())
    assert report.ok, report.to_text()
    rec = reconcile(lake)
    assert rec.exact, rec.problems
    # one pass of the job processed everything: each posting landed once (result, malformed row or
    # contract error), and the ledger the run booked in PostgreSQL equals the OK results
    assert rec.results + sum(rec.malformed.values()) + rec.contract_breaks == rec.postings == 40
    assert rec.ok > 0
    db = LedgerDB(dsn_from_env(webserver.pg_dir))
    t = totals(db)
    assert (t.entries, t.amount) == (rec.ok, rec.ok_amount) and t.balanced


REEXECUTE = """
mutation($params: ReexecutionParams!) {
  launchRunReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
  }
}"""


def report_rows(lake: Lake, day: str) -> list[dict]:
    t = DeltaTable(f"{lake.root}/assets/settlement_report").to_pyarrow_table()
    return sorted(t.filter(pc.equal(t["partition_key"], day)).to_pylist(), key=lambda r: r["participant"])


def test_settlement_partition_rerun_from_the_ui_never_doubles(webserver: Webserver) -> None:
    """A day of the report launched as the UI does (partition tag), then re-executed (the UI's
    *Re-execute*): the same rows, never doubled. Runs after the traffic and the job above."""
    lake = Lake(root=webserver.lake_root)
    assert lake.queue("results").count() > 0, "needs the runs of the test above"
    day = "2026-11-20"
    # the report's days are dynamic partitions (the value dates in results): add the day as the
    # UI's "Add partition" does (the settlement_days sensor does it when the daemon runs)
    added = webserver.graphql(ADD_PARTITION, {
        "r": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"},
        "n": "settlement_days", "k": day})["addDynamicPartition"]
    assert added["__typename"] in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"), added
    selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                "jobName": "__ASSET_JOB", "assetSelection": [{"path": ["settlement_report"]}]}
    params = {"selector": selector, "runConfigData": {},
              "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day}]}}
    result = webserver.graphql(LAUNCH, {"executionParams": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    first = result["run"]["runId"]
    assert wait_for(webserver, first) == "SUCCESS", run_failure(webserver, first)
    once = report_rows(lake, day)
    assert once and sum(r["sent_count"] for r in once) > 0

    again = webserver.graphql(REEXECUTE, {"params": {"parentRunId": first, "strategy": "ALL_STEPS"}})
    again = again["launchRunReexecution"]
    assert again["__typename"] == "LaunchRunSuccess", again
    rerun = again["run"]["runId"]
    assert wait_for(webserver, rerun) == "SUCCESS", run_failure(webserver, rerun)
    assert report_rows(lake, day) == once
    assert DeltaTable(f"{lake.root}/assets/settlement_report").to_pyarrow_table().num_rows == len(once)
