"""Every code example of README.md and docs/*.md is run by a test or allowed in the reviewed list of
tests/docs/examples.py; this module runs the shell examples (and the Python ones of docs/).

Shell commands run with ``bash -c`` exactly as printed, in a temporary workspace (copies of the
project's working files and ``.venv`` linked; see conftest.py), with ``cues`` on PATH as after
activating the venv: each must exit 0 without a Python traceback, and what it claims is checked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cues_platform.queues import Lake
from tests.deployment.support import Webserver, free_port, wait_until_up
from tests.docs import examples
from tests.docs.conftest import run_printed, shell_env
from tests.docs.examples import (
    ALLOWED,
    AUDIT,
    AUDIT_GRAPH,
    AUDIT_JSON,
    DAGSTER_DEV,
    MATERIALIZE_DAY,
    NOT_CODE,
    PARTICIPANT_COMMANDS,
    PYTHON,
    RUN_BY,
    SHELL,
    blocks,
    command,
    function_source,
    keys,
    python_block,
)

DEMO_TIMEOUT = 900.0  # the main job: ~40 s on 2 quiet cores, a few minutes when busy


# -- the registry ----------------------------------------------------------------------------------------
def test_every_example_is_classified() -> None:
    """Each python block and each shell command is run by a named test or allowed with a reason;
    every other block has a language that is not code. A new example fails here until it is."""
    problems = []
    for block in blocks():
        if block.language in NOT_CODE:
            continue
        if block.language not in PYTHON | SHELL:
            problems.append(f"{block.where}: fence language {block.language!r} is neither run nor known "
                            f"not to be code: label it ({sorted(PYTHON | SHELL | set(NOT_CODE))})")
            continue
        for key in keys(block):
            if (block.file, key) not in RUN_BY and (block.file, key) not in ALLOWED:
                problems.append(f"{block.where}: {key!r} is run by no test: add a test and register it in "
                                "RUN_BY of tests/docs/examples.py (or, reviewed, in ALLOWED with the reason)")
    assert not problems, "\n".join(problems)
    assert len([b for b in blocks() if b.language in PYTHON | SHELL]) >= 12  # the extractor sees them


def test_registry_names_existing_examples_and_tests() -> None:
    """No stale entry: every registered example is still printed, every named test exists and its
    source names the example it runs (the key itself, or the constant of examples.py holding it)."""
    present = {(b.file, k) for b in blocks() for k in keys(b)}
    assert not set(RUN_BY) & set(ALLOWED)
    stale = sorted((set(RUN_BY) | set(ALLOWED)) - present)
    assert not stale, f"registered but no longer in the docs: {stale}"
    constants = {name: value for name, value in vars(examples).items() if name.isupper()}
    for (file, key), node_id in RUN_BY.items():
        source = function_source(node_id)
        names = [n for n, v in constants.items() if v == key or (isinstance(v, tuple) and key in v)]
        assert repr(key) in source or f'"{key}"' in source or any(n in source for n in names), (
            f"{node_id} does not name the example it is registered for: {file}: {key!r}")
    for reason in ALLOWED.values():
        assert len(reason) > 40  # a reason a reviewer can check, not a placeholder


# -- docs/dagster.md -----------------------------------------------------------------------------
def test_build_definitions_example(exec_block: Callable[..., dict]) -> None:
    """"complete with default resources: zero set-up": the definitions resolve, with one asset per
    processor output, the job, the schedule, the recovery sensor and a new-data sensor."""
    ns = exec_block(python_block("docs/dagster.md", "A graph becomes definitions"))
    defs, graph = ns["defs"], ns["graph"]
    repo = defs.get_repository_def()  # resolves every definition and its resources, or raises
    asset_keys = {"/".join(k.path) for k in repo.asset_graph.get_all_asset_keys()}
    outputs = {o.queue for p in graph.processors.values() for o in p.outputs.values()}
    assert outputs and outputs <= asset_keys
    assert repo.get_job(f"{graph.name}__all") is not None
    assert repo.get_schedule_def(f"{graph.name}__schedule").cron_schedule == "*/15 * * * *"
    sensors = {s.name for s in repo.sensor_defs}
    assert f"{graph.name}__recovery" in sensors
    assert any(name.endswith("__new_data") for name in sensors)


def test_processor_asset_example(spark: Any, chdir_tmp: Path, exec_block: Callable[..., dict],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """"Two ways to write a processor": the decorated function is the asset body; it prints
    ``True 3`` and its output queue holds every order once, doubled, with its delivery hash."""
    ns = exec_block(python_block("docs/dagster.md", "Two ways to write a processor"))
    assert capsys.readouterr().out.splitlines()[-1] == "True 3"
    doubled = ns["lake"].queue("doubled").read_arrow(partition="0")
    assert sorted(doubled["amount"].to_pylist()) == [20.0, 40.0, 60.0]
    assert len(set(doubled["_delivery_hash"].to_pylist())) == 1
    assert ns["graph"].processors["double"].asset_body.value == "function"


# -- docs/auditor.md ----------------------------------------------------------------------------------
SHOP_GRAPH = '''
import pyarrow as pa
from pyspark.sql import functions as F

from cues_platform.processing import ERROR_SCHEMA, Graph, In, Kind, Options, Out, Processor, QueueDef

ORDERS = pa.schema([pa.field("order_id", pa.int64(), nullable=False), ("amount", pa.float64())])


def enrich(ctx, orders):
    return orders.select("order_id", (F.col("amount") * 2).alias("amount"))


def split(ctx, enriched):
    rows = enriched.select("order_id", "amount")
    return {"big": rows.where(F.col("amount") >= 50), "small": rows.where(F.col("amount") < 50)}


graph = Graph.build(
    name="shop",
    queues=[QueueDef("orders", ORDERS), QueueDef("enriched", ORDERS), QueueDef("big", ORDERS),
            QueueDef("small", ORDERS), QueueDef("errors", ERROR_SCHEMA)],
    processors=[
        Processor("enrich", Kind.MAP, enrich, {"orders": In("orders")}, {"out": Out("enriched")},
                  options=Options(batch_size=10)),
        Processor("split", Kind.FORK, split, {"enriched": In("enriched")},
                  {"big": Out("big"), "small": Out("small")}, options=Options(batch_size=10)),
    ],
    error_queue="errors",
)
'''


def test_retention_example(exec_block: Callable[..., dict], capsys: pytest.CaptureFixture) -> None:
    """docs/queues.md "Retention": the start goes to the tailer's position, not past, and a read
    below it names the start; what it prints is the text block under it, line for line."""
    ns = exec_block(python_block("docs/queues.md", "Retention"))
    assert ns["orders"].start_offset("0") == 60
    (printed,) = [b for b in examples.blocks()
                  if b.file == "docs/queues.md" and b.section == "Retention" and b.language == "text"]
    assert capsys.readouterr().out.splitlines() == printed.text.strip("\n").splitlines()


def test_auditor_examples(spark: Any, chdir_tmp: Path, exec_block: Callable[..., dict]) -> None:
    """The auditor's examples on the lake of their text: ``./lake`` with processors ``enrich`` (map)
    and ``split`` (fork) of the graph ``shop/graph.py:graph``, run exactly once: clean."""
    from cues_platform.processing import GraphRunner
    from cues_platform.processing.loader import load_graph

    (chdir_tmp / "shop").mkdir()
    (chdir_tmp / "shop" / "graph.py").write_text(SHOP_GRAPH)
    graph = load_graph("shop/graph.py:graph")
    lake = Lake(root="./lake")
    for name, q in graph.queues.items():
        lake.create_queue(name, schema=q.schema, partitions=q.partitions, exist_ok=True)
    lake.queue("orders").append(pa.table({"order_id": pa.array(range(42), pa.int64()),
                                          "amount": [float(i) for i in range(42)]}), partition="0")
    GraphRunner(graph=graph, lake=lake).run_until_idle()
    assert lake.queue("big").read_arrow(partition="0").num_rows == 17  # amounts 2 * (25..41)
    assert lake.queue("errors").read_arrow(partition="0").num_rows == 0

    ns = exec_block(python_block("docs/auditor.md", "The auditor"))
    report = ns["report"]
    assert report.ok and report.violations == ()
    enrich = report.processors["enrich"]
    assert enrich.steps_delivered == 5 and enrich.outcomes.get("output") == 5 and enrich.pending is None

    env = shell_env()
    text = run_printed(command("docs/auditor.md", AUDIT), chdir_tmp, timeout=300, env=env).stdout
    assert text.splitlines()[0].endswith(": OK"), text  # "exit 0 when clean"
    assert "enrich: 5 step(s) delivered" in text and "  split: " in text, text
    as_json = json.loads(run_printed(command("docs/auditor.md", AUDIT_JSON), chdir_tmp, timeout=300,
                                     env=env).stdout)
    assert as_json["ok"] is True
    graph_text = run_printed(command("docs/auditor.md", AUDIT_GRAPH), chdir_tmp, timeout=300, env=env).stdout
    assert graph_text.splitlines()[0].endswith(": OK"), graph_text


# -- README / docs/reference-pipeline.md: the Dagster UI ----------------------------------------------
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_dagster_dev_serves_the_deployment(workspace: Path) -> None:
    """`dagster dev` as printed serves the UI on 127.0.0.1:3000 with the deployment's assets, job,
    sensors and schedule; stopped with SIGTERM (dagster dev's own graceful stop). If 3000 is taken
    on this machine the same command gets ``-p <free port>`` appended (the only change)."""
    cmd = command("README.md", DAGSTER_DEV)
    assert command("docs/reference-pipeline.md", DAGSTER_DEV).text == cmd.text
    text, port = cmd.text, 3000
    if not _port_free(port):
        port = free_port()
        text = f"{cmd.text} -p {port}"
    log = workspace / "dagster-dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", text], cwd=workspace, env=shell_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Webserver(f"http://127.0.0.1:{port}", proc, log, str(workspace / "lake"),
                       workspace / ".cues" / "postgres", workspace / "dagster_home")
    try:
        wait_until_up(server)
        data = server.graphql("{ assetNodes { assetKey { path } } }")
        assets = {"/".join(n["assetKey"]["path"]) for n in data["assetNodes"]}
        assert {"postings", "results", "settlement_report", "participant_traffic"} <= assets
        repo = server.graphql("""{ repositoriesOrError { ... on RepositoryConnection { nodes {
            jobs { name } sensors { name } schedules { name } } } } }""")["repositoriesOrError"]["nodes"][0]
        assert "payments__all" in {j["name"] for j in repo["jobs"]}
        assert "payments__schedule" in {s["name"] for s in repo["schedules"]}
        assert "payments__recovery" in {s["name"] for s in repo["sensors"]}
    finally:
        served = log.read_text(errors="replace")  # what it printed while serving, before the stop
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    # Serving printed no traceback. After SIGTERM, a sensor tick the daemon (sensors are on by
    # default) had started can print Dagster's own "Could not reach user code server" traceback as
    # the code server stops first: Dagster's shutdown order, not ours (docs/dagster.md).
    assert "Traceback" not in served, served[-4000:]


# -- docs/reference-pipeline.md: the main job and a day of the report again --------------------------
def _report_day(workspace: Path, day: str) -> list[dict]:
    t = DeltaTable(str(workspace / "lake" / "assets" / "settlement_report")).to_pyarrow_table()
    return sorted((r for r in t.to_pylist() if r["partition_key"] == day), key=lambda r: r["participant"])


def _instance_records(workspace: Path) -> tuple[list, dict[str, set[str]], int]:
    """(runs, {asset: partitions materialized}, {(asset, check): passed} of the newest check
    evaluations) of the workspace's instance."""
    from dagster import AssetKey, DagsterEventType, DagsterInstance, EventRecordsFilter

    home = workspace / "dagster_home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        with DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_runs()
            parts = {key: {r.partition_key or "" for r in instance.fetch_materializations(AssetKey(key), limit=100).records}
                     for key in ("instructions", "results", "settlement_report")}
            records = instance.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION), limit=1000)
            checks = {}
            for rec in records:  # {(asset, check): passed} of the newest evaluation of each check
                data = rec.event_log_entry.dagster_event.event_specific_data
                checks.setdefault((data.asset_key.to_user_string(), data.check_name), data.passed)
    return runs, parts, checks


def test_cues_demo_then_a_day_again(workspace: Path) -> None:
    """`bash run.sh demo` (= `.venv/bin/cues demo`, as its comment says) runs the deployment's job
    as Dagster runs on the project's instance, against the lake the UI serves (`./lake`): two value
    dates and a clean audit, and the instance holds the runs, the materializations, the check
    results and both report partitions. The printed `dagster asset materialize` of 2026-11-21 then
    writes that day's report on the same instance and lake, and again gives the same rows."""
    assert command("docs/reference-pipeline.md", "bash run.sh demo").text.endswith("# = .venv/bin/cues demo")
    out = run_printed(".venv/bin/cues demo", workspace, timeout=DEMO_TIMEOUT).stdout
    assert "2026-11-21" in out and "clean" in out and "exact" in out, out[-3000:]
    runs, parts, checks = _instance_records(workspace)
    assert {r.job_name for r in runs} == {"payments__all", "__ASSET_JOB"}
    assert all(r.status.value == "SUCCESS" for r in runs)
    assert parts["instructions"] and parts["results"] and checks
    assert checks[("errors", "no_platform_errors")] is True  # the job runs the error queue's check
    assert parts["settlement_report"] == {"2026-11-20", "2026-11-21"}
    once = _report_day(workspace, "2026-11-21")
    assert once and sum((r["net_position"] for r in once), Decimal(0)) == 0

    materialize = command("docs/reference-pipeline.md", MATERIALIZE_DAY)
    run_printed(materialize, workspace, timeout=DEMO_TIMEOUT)
    assert _report_day(workspace, "2026-11-21") == once
    run_printed(materialize, workspace, timeout=DEMO_TIMEOUT)
    assert _report_day(workspace, "2026-11-21") == once
    assert len(_instance_records(workspace)[0]) == len(runs) + 2  # the CLI's runs: same instance


def test_cues_demo_engine_runner(workspace: Path) -> None:
    """The main job processed by the graph runner alone: exact and clean, no Dagster run."""
    out = run_printed(command("docs/reference-pipeline.md", ".venv/bin/cues demo --engine runner --messages 500"),
                      workspace, timeout=DEMO_TIMEOUT).stdout
    assert "exact" in out and "clean" in out, out[-3000:]
    assert not list((workspace / "dagster_home").glob("storage*"))


def test_cues_demo_queues(workspace: Path) -> None:
    """The earlier queue-layer demo (20,000 messages here) passes its own checks (exit 0)."""
    run_printed(command("docs/reference-pipeline.md", ".venv/bin/cues demo --queues --messages 20000"), workspace,
                timeout=DEMO_TIMEOUT)


# -- docs/benchmarks*.md --------------------------------------------------------------------------------
def test_bench_queues_quick(workspace: Path, tmp_path: Path) -> None:
    """`--quick` writes $TMPDIR/cues-bench/queues-quick.json (TMPDIR: this test's own folder)."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    run_printed(command("docs/benchmarks.md", ".venv/bin/python bench/bench_queues.py --quick"), workspace,
                timeout=DEMO_TIMEOUT, env=shell_env(TMPDIR=str(tmp)))
    doc = json.loads((tmp / "cues-bench" / "queues-quick.json").read_text())
    assert doc["results"]


def test_bench_pipes(workspace: Path) -> None:
    """Writes bench/results/pipes.json (of the workspace's copy of bench/)."""
    out = workspace / "bench" / "results" / "pipes.json"
    before = out.read_text()
    run_printed(command("docs/benchmarks-pipes.md", ".venv/bin/python bench/bench_pipes.py"), workspace,
                timeout=DEMO_TIMEOUT)
    assert out.read_text() != before and json.loads(out.read_text())["results"]


# -- docs/postings-protocol.md ------------------------------------------------------------------------
def test_participant_commands(workspace: Path) -> None:
    """register, post 1000, run 3 producers and 2 consumers (until stopped), and the completeness
    check: polled until every posting has its result, then the runs are stopped with SIGTERM."""
    register, post, producers, consumers, check = (command("docs/postings-protocol.md", c)
                                                  for c in PARTICIPANT_COMMANDS)
    env = shell_env()
    run_printed(register, workspace, timeout=300, env=env)
    assert "recorded 1000 posting(s)" in run_printed(post, workspace, timeout=300, env=env).stdout
    procs = []
    for cmd in (producers, consumers):
        log = (workspace / f"{cmd.key.split()[4]}.log").open("w")
        procs.append((cmd, log, subprocess.Popen(["bash", "-c", cmd.text], cwd=workspace, env=env, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True)))
    try:
        deadline = DEMO_TIMEOUT
        start = time.monotonic()
        while True:
            proc = subprocess.run(["bash", "-c", check.text], cwd=workspace, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert "Traceback" not in proc.stderr, proc.stderr
            if proc.returncode == 0:
                break
            for cmd, _, p in procs:
                assert p.poll() is None, f"`{cmd.text}` exited {p.returncode}"
            assert time.monotonic() - start < deadline, f"not complete after {deadline}s: {proc.stdout[-2000:]}"
            time.sleep(2)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for _, log, p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
            log.close()
    for cmd, _, p in procs:
        text = (workspace / f"{cmd.key.split()[4]}.log").read_text(errors="replace")
        assert p.returncode == 0 and "Traceback" not in text, f"`{cmd.text}` exited {p.returncode}:\n{text[-3000:]}"
