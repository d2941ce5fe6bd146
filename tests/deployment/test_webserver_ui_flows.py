"""The UI's real flows, clicked in headless Chromium (over the DevTools protocol, tests/deployment/
cdp.py) on the shared test webserver, after test_webserver.py's runs:

1. *Materialize* on the ``participant_traffic`` asset page launches a run that succeeds;
2. a run of ``intake`` fails (an injected fault, once), and the run page's *Re-execute* → *From
   failure* launches the run that finishes it: green, and the lake audits clean;
3. *Execute all* on the ``errors`` asset's checks runs ``no_platform_errors``, which fails on an
   error row a platform failure wrote, and the checks page shows it.

``CUES_SCREENSHOT_DIR=docs/img`` saves each step's screenshot there (docs/dagster.md shows them)."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from cues_platform.audit import audit
from cues_platform.processing import ERROR_SCHEMA
from cues_platform.queues import Lake
from cues_platform.reference.pipeline import payments_graph
from tests.deployment.cdp import Browser
from tests.deployment.support import DeploymentTestError, Webserver
from tests.deployment.test_webserver import launch, run_failure, wait_for
from tests.support import ROOT

RUNS = """query($filter: RunsFilter) { runsOrError(filter: $filter, limit: 5) { __typename
  ... on Runs { results { runId status tags { key value } } } } }"""


def newest_run(server: Webserver, **tags: str) -> str | None:
    flt = {"tags": [{"key": k, "value": v} for k, v in tags.items()]} if tags else {}
    results = server.graphql(RUNS, {"filter": flt})["runsOrError"]["results"]
    return results[0]["runId"] if results else None


def child_run(server: Webserver, parent: str, *, timeout: float = 60) -> str:
    """The run the UI launched from ``parent`` (its ``dagster/parent_run_id`` tag), once it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        child = newest_run(server, **{"dagster/parent_run_id": parent})
        if child:
            return child
        time.sleep(0.5)  # polling the server for a condition, with a deadline
    raise DeploymentTestError(f"no re-execution of run {parent} after {timeout:.0f} s:\n{server.tail()}")


def shot(browser: Browser, tmp: Path, name: str) -> Path:
    path = browser.screenshot(tmp / name)
    assert path.stat().st_size > 20_000, f"{name}: a blank page?"
    target = os.environ.get("CUES_SCREENSHOT_DIR")
    if target:
        dest = Path(target) if Path(target).is_absolute() else ROOT / target
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / name)
    return path


def test_launch_reexecute_from_failure_and_a_failed_check_in_the_ui(webserver: Webserver, tmp_path: Path) -> None:
    browser = Browser(tmp_path / "profile")
    try:
        # 1: launch a materialization from the asset page
        before = newest_run(webserver)
        browser.goto(f"{webserver.url}/assets/participant_traffic")
        browser.click("Materialize")
        browser.wait_for_text("Launched run")
        launched = newest_run(webserver)
        assert launched and launched != before
        assert wait_for(webserver, launched) == "SUCCESS", run_failure(webserver, launched)
        browser.goto(f"{webserver.url}/runs/{launched}")
        browser.wait_for_text("RUN_SUCCESS")  # the run's event log has loaded
        shot(browser, tmp_path, "ui-1-materialized-from-the-ui.png")

        # 2: a failed run, re-executed from failure in the UI
        failed = launch(webserver, "__ASSET_JOB", assets=["instructions"], run_config={"ops": {"intake": {"config": {
            "inject_failure_at": "after_prepare", "inject_failure_once_file": str(tmp_path / "fired")}}}})
        assert wait_for(webserver, failed) == "FAILURE"
        browser.goto(f"{webserver.url}/runs/{failed}")
        browser.wait_for_text("RUN_FAILURE")
        browser.wait_for_text("Re-execute all (*)")
        shot(browser, tmp_path, "ui-2-failed-run.png")
        browser.open_menu_beside("Re-execute all (*)")
        browser.click("From failure", selector="[role=menuitem], li, a, button")
        child = child_run(webserver, failed)  # the UI opens the new run's page
        assert wait_for(webserver, child) == "SUCCESS", run_failure(webserver, child)
        browser.goto(f"{webserver.url}/runs/{child}")
        browser.wait_for_text("RUN_SUCCESS")
        shot(browser, tmp_path, "ui-3-reexecuted-from-failure.png")
        lake = Lake(root=webserver.lake_root)
        assert lake.queue("instructions").count() > 0
        report = audit(lake, graph=payments_graph())
        assert report.ok, report.to_text()

        # 3: a failed check, executed from the asset's checks page
        row = {"processor": ["parse"], "step": [99], "inputs": ['{"instructions": ["instructions", "0", 0, 1]}'],
               "exception_type": ["py4j.protocol.Py4JJavaError"], "message": ["executor lost"],
               "traceback": [""], "failed_at": [datetime.now(UTC)], "queue": [None], "payload": [None]}
        lake.queue("errors").append(pa.table(row, schema=ERROR_SCHEMA), partition="0")
        browser.goto(f"{webserver.url}/assets/errors?view=checks")
        browser.click("Execute all")
        browser.wait_for_text("Launched run")
        check_run = newest_run(webserver)
        assert wait_for(webserver, check_run) == "SUCCESS", run_failure(webserver, check_run)
        browser.goto(f"{webserver.url}/assets/errors?view=checks")
        browser.wait_for_text("no_platform_errors")
        browser.wait_for_text("Failed")
        shot(browser, tmp_path, "ui-4-failed-check.png")
    finally:
        browser.close()
