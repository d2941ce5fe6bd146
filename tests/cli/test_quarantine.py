"""``cues quarantine``: what a check holds open, quarantining it, what was quarantined, against a
real Dagster instance in a folder (``DAGSTER_HOME``, as a data engineer has one) and a real lake.

No Spark: the rows are appended by hand (with a delivery hash, as a step would have written them,
or without one, as a producer outside the protocol does) and only the checks of ``instructions``
run (their contract is pandas, the audit reads the lake), so each check's memory is what the
deployed check writes. The documented commands run with ``bash -c`` exactly as printed.
"""

from __future__ import annotations

from pathlib import Path

import pandera.pandas as pap
import pyarrow as pa
import pytest
from click.testing import CliRunner
from dagster import AssetCheckKey, AssetKey, AssetSelection, instance_for_test, materialize

from cues_platform.cli import main
from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.processing import ERROR_SCHEMA, Graph, In, Kind, Out, Processor, QueueDef
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.docs.conftest import run_printed, shell_env
from tests.support import PAYLOAD, rows

HASH = "ab" * 16  # a delivery hash as a step writes it (the checks here do not look it up)
CHECKS = [AssetCheckKey(AssetKey("instructions"), n) for n in ("contract", "outside_protocol")]


def _parse(ctx, src):
    """Never runs here: the tests execute only the checks of its output."""
    return src


def _graph() -> Graph:
    contract = pap.DataFrameSchema({"id": pap.Column("int64", pap.Check.ge(0)),
                                    "note": pap.Column(str, nullable=True)})
    queues = [QueueDef("postings", PAYLOAD), QueueDef("instructions", PAYLOAD, contract=contract),
              QueueDef("errors", ERROR_SCHEMA)]
    procs = [Processor("intake", Kind.MAP, _parse, {"src": In("postings")}, {"out": Out("instructions")})]
    return Graph.build(name="payments", queues=queues, processors=procs, error_queue="errors")


class Place:
    """A working folder holding ``lake/`` and ``dagster_home/`` (a Dagster instance)."""

    def __init__(self, root: Path) -> None:
        self.root, self.home = root, root / "dagster_home"
        self.home.mkdir(parents=True)
        self.lake = Lake(root=str(root / "lake"))
        self.graph = _graph()
        create_queues(self.graph, self.lake)
        self.defs = build_definitions(self.graph, lake=LakeResource(root=self.lake.root), spark=CuesSparkResource())

    def check(self) -> dict[str, tuple[bool, dict]]:
        """Executes the two checks of ``instructions`` in the instance; their results by name."""
        with instance_for_test(temp_dir=str(self.home)) as instance:
            result = materialize([*self.defs.assets, *self.defs.asset_checks], resources=dict(self.defs.resources),
                                 instance=instance, selection=AssetSelection.checks(*CHECKS), raise_on_error=False)
        return {e.check_name: (e.passed, {k: v.value for k, v in e.metadata.items()})
                for e in result.get_asset_check_evaluations()}

    def cues(self, *args: str, home: str | None = "default") -> object:
        env = {"DAGSTER_HOME": str(self.home) if home == "default" else home}
        return CliRunner().invoke(main, [*args, "--lake", self.lake.root], env=env)


@pytest.fixture
def place(tmp_path: Path) -> Place:
    return Place(tmp_path / "work")


def _open_rows(place: Place) -> None:
    """30 rows a step delivered (one breaks the contract: id -1 at offset 5), judged; then two rows
    appended without a delivery hash (offsets 30, 31; -7 breaks the contract)."""
    batch = rows(0, 30)
    batch = batch.set_column(0, "id", pa.array([-1 if i == 5 else i for i in range(30)], pa.int64()))
    place.lake.queue("instructions").append(batch, partition="0", delivery_hash=HASH)
    first = place.check()
    assert not first["contract"][0] and first["contract"][1]["cues/open_failing"] == {"0": [[5, 6]]}
    assert first["outside_protocol"][0] and first["outside_protocol"][1]["cues/judged_to"] == {"0": 30}
    place.lake.queue("instructions").append(
        pa.table({"id": pa.array([8, -7], pa.int64()), "note": ["typed in", "typed in too"]}), partition="0")
    second = place.check()
    assert second["outside_protocol"][1]["offsets"] == {"0": [[30, 32]]}


def _out(result) -> str:
    return result.output


def test_list_add_show_turn_both_checks_green_and_a_retry_writes_nothing(place: Place) -> None:
    _open_rows(place)
    listed = place.cues("quarantine", "list", "instructions")
    assert listed.exit_code == 0, listed.output
    text = _out(listed)
    assert "instructions: contract (last evaluation: run " in text and "judged to 0:32" in text
    assert "holds 1 row(s) open" in text and "rule id: greater_than_or_equal_to(0): 1 failure(s)" in text
    assert "partition 0: [5, 6)" in text and '0/5 {"id": -1, "note": "n5"}' in text
    assert "holds 2 row(s) open" in text and "rule no delivery hash" in text
    assert "partition 0: [30, 32)" in text and '0/31 {"id": -7, "note": "typed in too"}' in text
    assert "cues quarantine add instructions --check outside_protocol --all-open --reason TEXT" in text

    added = place.cues("quarantine", "add", "instructions", "-p", "0", "--offsets", "30:32", "--offsets", "5",
                       "--reason", "typed in by hand; checked")
    assert added.exit_code == 0, added.output
    assert "quarantined 0: [5, 6), [30, 32) into errors (3 error row(s))" in added.output
    again = place.cues("quarantine", "add", "instructions", "--all-open", "--reason", "again")
    assert again.exit_code == 0 and "were quarantined before: nothing written" in again.output

    pending = _out(place.cues("quarantine", "list", "instructions"))  # before the next evaluation
    assert pending.count("quarantined since, closed at its next evaluation") == 2
    assert "instructions: nothing open: no check holds a row of it" in pending

    after = place.check()
    assert after["contract"][0] and after["contract"][1]["closed_by_quarantine_rows"] == 1
    assert after["outside_protocol"][0] and after["outside_protocol"][1]["closed_by_quarantine_rows"] == 2
    assert place.check()["outside_protocol"][0]  # and it stays green

    shown = place.cues("quarantine", "show", "instructions")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("instructions 0 [5, 6) 1 row(s) ")
    assert lines[0].endswith("(cues_platform.ContractViolation): quarantined by an operator: typed in by hand; checked")
    assert lines[1].startswith("instructions 0 [30, 32) 2 row(s) ") and "(cues_platform.OutsideProtocol)" in lines[1]
    assert "no delivery hash): typed in by hand; checked" in lines[1]


def test_a_queue_with_nothing_open_says_so_and_all_open_writes_nothing(place: Place) -> None:
    place.lake.queue("instructions").append(rows(0, 3), partition="0", delivery_hash=HASH)
    assert all(ok for ok, _ in place.check().values())
    listed = place.cues("quarantine", "list", "instructions")
    assert listed.exit_code == 0
    assert listed.output.count("  nothing open") == 2
    assert listed.output.splitlines()[-1] == "instructions: nothing open: no check holds a row of it"
    added = place.cues("quarantine", "add", "instructions", "--all-open", "--reason", "nothing")
    assert added.exit_code == 0 and added.output == "instructions: nothing open: nothing quarantined\n"
    assert place.lake.queue("errors").count() == 0
    shown = place.cues("quarantine", "show", "instructions")
    assert shown.output == "instructions: nothing quarantined in errors\n"


def _error(result) -> str:
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


def test_bad_input_is_one_line_naming_what_was_wrong_and_what_to_do(place: Place, tmp_path: Path) -> None:
    _open_rows(place)
    assert "no Dagster instance: DAGSTER_HOME is not set" in _error(
        place.cues("quarantine", "list", "instructions", home=""))
    missing = tmp_path / "nowhere"
    assert f"no Dagster instance at {missing}: the folder does not exist" in _error(
        place.cues("quarantine", "list", "instructions", home=str(missing)))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "it has no dagster.yaml and no storage" in _error(
        place.cues("quarantine", "list", "instructions", home=str(empty)))
    assert not list(empty.iterdir())  # nothing created there
    assert "queue 'nope' does not exist" in _error(place.cues("quarantine", "list", "nope"))
    assert "holds no evaluation of check(s) contract, outside_protocol of asset 'postings'" in _error(
        place.cues("quarantine", "list", "postings"))
    assert "give --asset when the asset key has a prefix" in _error(
        place.cues("quarantine", "list", "instructions", "--asset", "payments/instructions"))

    not_held = _error(place.cues("quarantine", "add", "instructions", "-p", "0", "--offsets", "29:31",
                                 "--reason", "r"))
    assert "offsets 0: [29, 30) of instructions are not held open by check(s) contract, outside_protocol" in not_held
    assert "(they hold: 0: [5, 6), [30, 32))" in not_held and "`cues quarantine list instructions`" in not_held
    assert "no partition" in _error(place.cues("quarantine", "add", "instructions", "-p", "9", "--offsets", "5",
                                               "--reason", "r"))
    assert "give START:END" in _error(place.cues("quarantine", "add", "instructions", "-p", "0", "--offsets",
                                                 "5-6", "--reason", "r"))
    assert "0 <= START < END" in _error(place.cues("quarantine", "add", "instructions", "-p", "0", "--offsets",
                                                   "6:5", "--reason", "r"))
    assert "--offsets needs --partition" in _error(place.cues("quarantine", "add", "instructions", "--offsets",
                                                              "5", "--reason", "r"))
    assert "not both" in _error(place.cues("quarantine", "add", "instructions", "--all-open", "-p", "0",
                                           "--offsets", "5", "--reason", "r"))
    assert "Missing option '--reason'" in _error(place.cues("quarantine", "add", "instructions", "--all-open"))
    assert "give the reason in words" in _error(place.cues("quarantine", "add", "instructions", "--all-open",
                                                           "--reason", "  "))
    assert place.lake.queue("errors").count() == 0  # nothing was written by any of them


# -- the documented commands (docs/dagster.md, "From a red check to a green pipeline") -----------
def test_the_documented_quarantine_commands_run_as_printed(place: Place) -> None:
    """Someone appended two rows into ``instructions``; the commands docs/dagster.md prints list
    them, quarantine them with a reason and show it (each run with ``bash -c`` as printed, in a
    folder holding ``lake/`` and ``dagster_home/``); the next evaluation is green."""
    from tests.docs.examples import ROOT, SHELL, command, command_key, commands, extract

    # each as the page prints it, with its key in tests/docs/examples.py's registry (its shell words)
    printed = (
        ("DAGSTER_HOME=$PWD/dagster_home cues quarantine list instructions --lake ./lake",
         "DAGSTER_HOME=$PWD/dagster_home cues quarantine list instructions --lake ./lake"),
        ('DAGSTER_HOME=$PWD/dagster_home cues quarantine add instructions -p 0 --offsets 30:32 --reason "typed in by hand to try the UI, not real instructions" --lake ./lake',
         "DAGSTER_HOME=$PWD/dagster_home cues quarantine add instructions -p 0 --offsets 30:32 --reason typed in by hand to try the UI, not real instructions --lake ./lake"),
        ("DAGSTER_HOME=$PWD/dagster_home cues quarantine show instructions --lake ./lake",
         "DAGSTER_HOME=$PWD/dagster_home cues quarantine show instructions --lake ./lake"),
    )

    on_page = {c.key for b in extract(ROOT / "docs/dagster.md") if b.language in SHELL for c in commands(b)}
    for text, key in printed:
        assert command_key(text) == key
        if key in on_page:  # the page prints it exactly so
            assert command("docs/dagster.md", key).text == text
    _open_rows(place)
    env = shell_env()
    assert "DAGSTER_HOME" not in env
    (list_cmd, _), (add_cmd, _), (show_cmd, _) = printed
    listed = run_printed(list_cmd, place.root, timeout=120, env=env)
    assert "partition 0: [30, 32)" in listed.stdout and "rule no delivery hash" in listed.stdout
    added = run_printed(add_cmd, place.root, timeout=120, env=env)
    assert "quarantined 0: [30, 32) into errors (2 error row(s))" in added.stdout
    shown = run_printed(show_cmd, place.root, timeout=120, env=env)
    assert "[30, 32) 2 row(s)" in shown.stdout and "not real instructions" in shown.stdout
    checks = place.check()
    assert checks["outside_protocol"][0] and not checks["contract"][0]  # offset 5 is the contract's
