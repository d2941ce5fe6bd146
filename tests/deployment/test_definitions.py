"""The reference deployment's Dagster definitions load: the payments assets (one per processor
output, the ``validate`` fork as a multi-asset), their checks, sensors, the job and its schedule,
the daily settlement report and the simulated traffic, and one resource per key."""

from __future__ import annotations

from pathlib import Path

import yaml
from dagster import AssetKey, DailyPartitionsDefinition

from tests.support import ROOT

PROCESSOR_ASSETS = {"fx_rates", "instructions", "parsed", "priced", "results", "ledger_entries",
                    "malformed", "ledger"}


def _repo():
    from definitions import defs

    return defs.get_repository_def()


def test_definitions_load_every_payments_asset() -> None:
    repo = _repo()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert PROCESSOR_ASSETS | {"postings", "settlement_report", "participant_traffic"} <= keys
    assert "queue_demo" not in keys
    # lineage follows the graph: postings -> instructions -> parsed -> priced -> results ...
    graph = repo.asset_graph
    assert AssetKey("postings") in graph.get(AssetKey("instructions")).parent_keys
    assert {AssetKey("parsed"), AssetKey("fx_rates")} <= graph.get(AssetKey("priced")).parent_keys
    assert AssetKey("results") in graph.get(AssetKey("settlement_report")).parent_keys
    assert AssetKey("ledger_entries") in graph.get(AssetKey("ledger")).parent_keys
    # validate is one fork: its three outputs are delivered as one unit (one multi-asset)
    fork = repo.assets_defs_by_key[AssetKey("results")]
    assert {AssetKey("results"), AssetKey("ledger_entries"), AssetKey("malformed")} <= set(fork.keys)


def test_checks_sensors_job_schedule() -> None:
    repo = _repo()
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    for key in PROCESSOR_ASSETS - {"fx_rates"}:
        assert (key, "exactly_once") in checks, key
    assert ("instructions", "contract") in checks
    sensors = {s.name for s in repo.sensor_defs}
    assert {"payments__intake__new_data", "payments__parse__new_data", "payments__convert__new_data",
            "payments__validate__new_data", "payments__ledger__sink", "payments__recovery"} <= sensors
    assert [s.name for s in repo.schedule_defs] == ["payments__schedule"]
    job = repo.get_job("payments__all")
    assert job is not None


def test_settlement_report_is_daily_partitioned() -> None:
    repo = _repo()
    report = repo.assets_defs_by_key[AssetKey("settlement_report")]
    assert isinstance(report.partitions_def, DailyPartitionsDefinition)
    keys = report.partitions_def.get_partition_keys()
    assert "2026-11-20" in keys and "2026-11-21" in keys


def test_resources_one_per_key() -> None:
    from definitions import defs
    from resources import LedgerResource

    resources = _repo().get_top_level_resources()
    assert {"lake", "spark", "ledger", "backing", "cues_io_manager"} <= set(resources)
    assert isinstance(defs.resources["ledger"], LedgerResource)


def test_workspace_and_dagster_home() -> None:
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_file"]
    assert (ROOT / target["relative_path"]).is_file()
    home = yaml.safe_load((ROOT / "dagster_home" / "dagster.yaml").read_text())
    assert home["telemetry"] == {"enabled": False}
    assert home["run_retries"] == {"enabled": True, "max_retries": 1}
    assert home["nux"] == {"enabled": False}
    assert "sqlite" in home["storage"]
    assert Path(ROOT / "dagster_home").is_dir()
