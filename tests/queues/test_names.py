"""Every name check matches the whole string: no trailing newline, control character, path
separator or ``..`` gets through any validator, and a refused create leaves nothing on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform.errors import ConfigurationError, CuesError
from cues_platform.participants.db import validate_database_name
from cues_platform.participants.network import validate_participant
from cues_platform.queues import InvalidNameError, Lake
from cues_platform.queues.names import validate_id, validate_name, validate_partition
from tests.support import PAYLOAD, rows

VALIDATORS = {
    "queue": lambda v: validate_name(v),
    "tailer": lambda v: validate_name(v, kind="tailer"),
    "processor": lambda v: validate_name(v, kind="processor"),
    "partition": validate_partition,
    "producer id": lambda v: validate_id(v, kind="producer id"),
    "transactional id": lambda v: validate_id(v, kind="transactional id"),
    "participant": validate_participant,
    "database": validate_database_name,
}
BAD_PIECES = st.one_of(
    st.characters(max_codepoint=0x1F),  # control characters, newline and tab included
    st.sampled_from(["\n", "\r\n", "\x7f", "/", "\\", "..", "\x00", " "]),
)
GOOD = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)


@st.composite
def bad_names(draw: st.DrawFn) -> str:
    base = draw(GOOD)
    at = draw(st.integers(0, len(base)))
    return base[:at] + draw(BAD_PIECES) + base[at:]


@pytest.mark.parametrize("kind", sorted(VALIDATORS))
@settings(max_examples=60, deadline=None)
@given(name=bad_names())
def test_every_validator_refuses_control_characters_separators_and_dots(kind, name) -> None:
    with pytest.raises(CuesError):
        VALIDATORS[kind](name)


@pytest.mark.parametrize("kind", sorted(VALIDATORS))
@pytest.mark.parametrize("suffix", ["\n", "\r", "\t"])
def test_a_trailing_newline_is_refused_everywhere(kind, suffix) -> None:
    VALIDATORS[kind]("ok")  # the name itself is legal
    with pytest.raises(CuesError):
        VALIDATORS[kind]("ok" + suffix)


def _files(root: str) -> list[Path]:
    return [p for p in Path(root).rglob("*")] if Path(root).exists() else []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=bad_names())
def test_a_refused_queue_or_partition_leaves_nothing_on_disk(tmp_path_factory, name) -> None:
    lake = Lake(root=str(tmp_path_factory.mktemp("lake")))
    with pytest.raises(InvalidNameError):
        lake.create_queue(name, schema=PAYLOAD)
    with pytest.raises(InvalidNameError):
        lake.create_queue("q", schema=PAYLOAD, partitions=[name])
    assert _files(lake.root) == []
    assert lake.list_queues() == []


def test_the_reported_names_are_refused_and_listing_survives_a_foreign_folder(lake) -> None:
    with pytest.raises(InvalidNameError):
        lake.create_queue("x\n", schema=PAYLOAD)
    with pytest.raises(InvalidNameError):
        lake.create_queue("nl", schema=PAYLOAD, partitions=["nl\n"])
    q = lake.create_queue("ok", schema=PAYLOAD)
    with pytest.raises(InvalidNameError):
        q.append(rows(0, 1), partition="0\n")  # acknowledged before, and no read found it
    with pytest.raises(InvalidNameError):
        q.tailer("t\n", partition="0")
    with pytest.raises(InvalidNameError):
        q.producer(producer_id="p\n")
    # a folder someone made by hand with an illegal name is not a queue, and breaks nothing
    (Path(lake.root) / "queues" / "x\n").mkdir()
    assert lake.list_queues() == ["ok"]


def test_a_create_that_fails_halfway_leaves_nothing(lake) -> None:
    with pytest.raises(ConfigurationError) as info:
        lake.create_queue("q", schema=PAYLOAD, properties={"delta.enableChangeDataFeed": "maybe"})
    assert "queue 'q' could not be created" in str(info.value)
    assert not Path(lake.queue_uri("q")).exists()
    assert lake.list_queues() == []
    assert lake.create_queue("q", schema=PAYLOAD).name == "q"  # the name is free again
