"""The reference deployment's Dagster definitions load: the payments assets (one per processor
output, the ``validate`` fork as a multi-asset), their checks, sensors, the job and its schedule,
the daily settlement report and the simulated traffic, the postings protocol participants (an
asset, a consistency check and a sensor each; no database touched), and one resource per key."""

from __future__ import annotations

from pathlib import Path

import yaml
from dagster import AssetKey, DynamicPartitionsDefinition

from tests.support import ROOT

PARTICIPANT_ASSETS = {"participant_bank_a_messages", "participant_bank_x_messages"}
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
    assert graph.get(AssetKey("postings")).parent_keys == {AssetKey("participant_traffic")}  # who writes it
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
    # contracts on every queue of business data: pandas row by row on instructions (in intake's
    # steps), pandera.pyspark on the others (the check, on Spark), shown in the column schema
    for key in ("instructions", "parsed", "fx_rates", "priced", "results", "ledger_entries"):
        assert (key, "contract") in checks, key
    schema = repo.asset_graph.get(AssetKey("results")).metadata["dagster/column_schema"]
    constraints = {c.name: c.constraints.other for c in schema.columns}
    assert constraints["status"] == ["isin(['OK', 'REJECTED'])"] and constraints["amount"] == ["greater_than(0)"]
    sensors = {s.name for s in repo.sensor_defs}
    assert {"payments__intake__new_data", "payments__parse__new_data", "payments__convert__new_data",
            "payments__validate__new_data", "payments__ledger__sink", "payments__recovery"} <= sensors
    assert sorted(s.name for s in repo.schedule_defs) == [
        "cues_maintenance__schedule", "cues_maintenance_participants__schedule",
        "participants__schedule", "payments__schedule"]
    job = repo.get_job("payments__all")
    assert job is not None
    # automation on by default: the daemon of `dagster dev` ticks them as soon as it loads them
    from dagster import DefaultScheduleStatus, DefaultSensorStatus

    assert {s.name for s in repo.sensor_defs if s.default_status is not DefaultSensorStatus.RUNNING} == set()
    assert {s.name for s in repo.schedule_defs if s.default_status is not DefaultScheduleStatus.RUNNING} == set()


def test_participants_next_to_payments() -> None:
    repo = _repo()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys >= PARTICIPANT_ASSETS  # default $CUES_PARTICIPANTS: bank-a producer, bank-x consumer
    for key in PARTICIPANT_ASSETS:
        node = repo.asset_graph.get(AssetKey(key))
        assert node.group_name == "participants" and node.is_materializable
    assert AssetKey("participant_bank_a_messages") in repo.asset_graph.get(
        AssetKey("participant_bank_x_messages")).parent_keys
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert {(k, "no_consistency_issues") for k in PARTICIPANT_ASSETS} <= checks
    sensors = {s.name for s in repo.sensor_defs}
    assert {"participant__bank_a__new_data", "participant__bank_x__new_data"} <= sensors
    assert repo.get_job("participants__all") is not None
    assert {"participants_lake", "spark"} <= set(repo.get_top_level_resources())


def test_participants_from_env_without_database(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    import pytest
    from dagster import Definitions

    from assets.participants import parse_participants, participant_defs
    from resources import RESOURCES

    # loading must reach no database: the embedded server's data dir is a file, so starting it
    # (or resolving a participant's DSN at all) would fail
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("CUES_PARTICIPANTS_DATA", str(tmp_path / "not-a-dir"))
    monkeypatch.setenv("CUES_PARTICIPANTS", "bank-q:producer:3,bank-r:consumer")
    repo = Definitions.merge(participant_defs(), Definitions(resources=RESOURCES)).get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == {
        "participant_bank_q_messages", "participant_bank_r_messages"}

    from cues_platform.participants.errors import ParticipantConfigError
    from cues_platform.participants.model import Role

    parsed = parse_participants("bank-b:producer:2, bank-c:consumer")
    assert [(p.id, p.role, p.slots) for p in parsed] == [("bank-b", Role.PRODUCER, 2),
                                                         ("bank-c", Role.CONSUMER, 1)]
    for bad in ("bank-b", "bank-b:driver", "bank-b:producer:0", "a:producer,a:consumer"):
        with pytest.raises(ParticipantConfigError):
            parse_participants(bad)
    # distinct ids whose asset keys and DSN variables would be the same are refused by name
    with pytest.raises(ParticipantConfigError, match="'bank-a' and 'bank_a' would share"):
        parse_participants("bank-a:producer,bank_a:consumer")


def test_settlement_report_is_partitioned_by_the_value_dates_that_exist() -> None:
    repo = _repo()
    report = repo.assets_defs_by_key[AssetKey("settlement_report")]
    assert isinstance(report.partitions_def, DynamicPartitionsDefinition)
    assert report.partitions_def.name == "settlement_days"
    assert {"settlement_days", "settlement_report_automation"} <= {s.name for s in repo.sensor_defs}


def test_resources_one_per_key() -> None:
    from definitions import defs
    from resources import LedgerResource

    resources = _repo().get_top_level_resources()
    assert {"lake", "spark", "ledger", "cues_io_manager", "participants_lake"} <= set(resources)
    # parse is a @processor_asset: its step IO manager keeps snapshots and attempts through backing
    assert {"backing", "cues_step_io"} <= set(resources)
    parse = _repo().assets_defs_by_key[AssetKey("parsed")]
    assert {"backing", "lake", "spark"} <= parse.required_resource_keys
    assert parse.get_output_name_for_asset_key(AssetKey("parsed")) and \
        parse.node_def.output_def_named(parse.get_output_name_for_asset_key(AssetKey("parsed"))).io_manager_key == "cues_step_io"
    assert isinstance(defs.resources["ledger"], LedgerResource)


def test_workspace_and_dagster_home() -> None:
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_file"]
    assert (ROOT / target["relative_path"]).is_file()
    home = yaml.safe_load((ROOT / "dagster_home" / "dagster.yaml").read_text())
    assert home["telemetry"] == {"enabled": False}
    assert home["run_retries"] == {"enabled": True, "max_retries": 3}
    assert home["nux"] == {"enabled": False}
    assert "sqlite" in home["storage"]
    assert Path(ROOT / "dagster_home").is_dir()
