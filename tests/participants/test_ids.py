"""Issue 10 item 5: one rule for participant ids, an injective id -> database mapping, and no
database created by a read-only command (on a real embedded PostgreSQL under --data-dir)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cues_platform.participants.cli import participant
from cues_platform.participants.db import database_name
from cues_platform.participants.errors import ParticipantConfigError
from cues_platform.participants.network import validate_participant
from cues_platform.pgserver_db import embedded_postgres, stop_embedded_postgres

INJECTION = "x'; drop table y; --"
LONG = "bank-" + "a" * 55  # 60 characters: valid, too long for cues_p_<id> (63 bytes)
IDS = st.from_regex(r"[a-z][a-z0-9_-]{0,63}", fullmatch=True)


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """A --data-dir whose embedded server runs (started once for the module). Outside pytest's
    basetemp, as ``pg_dsn``'s server (tests/conftest.py): concurrent pytest sessions rotate those
    folders under a running server."""
    path = Path(tempfile.mkdtemp(prefix="cues-test-ids-"))
    embedded_postgres(path / "pg")
    yield path
    stop_embedded_postgres(path / "pg")
    shutil.rmtree(path, ignore_errors=True)


def databases(data_dir: Path) -> set[str]:
    with psycopg.connect(embedded_postgres(data_dir / "pg")) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


def cli(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(participant, list(args))
    return out.exit_code, out.output


@pytest.mark.parametrize("bad", ["Bank-A", "BANK_A", "bank-A", INJECTION, "a" * 65, "1bank",
                                 "bank.a", "", "bank-a\n"])
def test_one_rule_refuses_upper_case_injection_and_too_long(bad: str) -> None:
    with pytest.raises(ParticipantConfigError, match="64 characters at most"):
        validate_participant(bad)


def test_upper_case_is_refused_with_the_lowercase_id_as_hint() -> None:
    with pytest.raises(ParticipantConfigError, match="ids are lowercase: 'bank-a'"):
        validate_participant("Bank-A")


def _near(a: str) -> st.SearchStrategy[str]:
    """Ids close to ``a``: '-' and '_' swapped, the last character changed, one more, any."""
    swapped = a.translate(str.maketrans("-_", "_-"))
    last = a[:-1] + ("b" if a[-1] != "b" else "c")
    longer = a + "-" if len(a) < 64 else a[:-1]
    return st.sampled_from([swapped, a.replace("-", "_"), last, longer]) | IDS


@settings(max_examples=400, deadline=None)
@given(data=st.data(), a=IDS)
def test_the_database_mapping_is_injective(data: st.DataObject, a: str) -> None:
    """Distinct valid ids never share a database (ids near each other included: '-' vs '_',
    long ids with the same first 39 characters); every name fits PostgreSQL's 63 bytes."""
    b = data.draw(_near(a))
    assert len(database_name(a)) <= 63 and len(database_name(b)) <= 63
    assert (database_name(a) == database_name(b)) == (a == b)


def test_the_reported_collisions_are_gone_and_old_names_stay() -> None:
    # bank-a keeps the database it always had; bank_a (once the same database) has its own
    assert database_name("bank-a") == "cues_p_bank_a"
    assert database_name("bank_a") != database_name("bank-a")
    assert database_name("bank_a").startswith("cues_h_bank_a_")
    assert database_name(LONG).startswith("cues_h_bank_")
    assert database_name(LONG) != database_name(LONG[:-1] + "b")


COMMANDS = {
    "register": lambda pid, d: ["register", "--lake", str(d / "lake"), "--producer", pid],
    "migrate": lambda pid, d: ["migrate", "--id", pid, "--data-dir", str(d)],
    "post": lambda pid, d: ["post", "--id", pid, "--to", "bank-x", "--lake", str(d / "lake"),
                            "--data-dir", str(d)],
    "post --to": lambda pid, d: ["post", "--id", "bank-a", "--to", pid, "--lake",
                                 str(d / "lake"), "--data-dir", str(d)],
    "run": lambda pid, d: ["run", "--id", pid, "--role", "producer", "--lake", str(d / "lake"),
                           "--data-dir", str(d)],
    "check": lambda pid, d: ["check", "--id", pid, "--role", "producer", "--data-dir", str(d)],
    "status": lambda pid, d: ["status", "--id", pid, "--data-dir", str(d)],
    "history": lambda pid, d: ["history", "--id", pid, "--message-id", "m", "--data-dir", str(d)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("bad", ["Bank-A", INJECTION])
def test_every_command_refuses_a_bad_id_and_creates_nothing(command: str, bad: str,
                                                            data_dir: Path) -> None:
    before = databases(data_dir)
    code, out = cli(*COMMANDS[command](bad, data_dir))
    assert code == 2 and out.startswith("error: invalid participant id") and \
        out.count("\n") == 1, out
    assert databases(data_dir) == before
    assert not (data_dir / "lake").exists()


def test_migrate_a_long_id_and_colliding_ids_get_their_own_databases(data_dir: Path) -> None:
    for pid in ("bank-a", "bank_a", LONG):
        code, out = cli("migrate", "--id", pid, "--data-dir", str(data_dir))
        assert code == 0 and "applied migrations" in out, out
        code, out = cli("status", "--id", pid, "--data-dir", str(data_dir))
        assert code == 0 and f"participant={pid} " in out, out
    assert {database_name(p) for p in ("bank-a", "bank_a", LONG)} <= databases(data_dir)
    assert len({database_name(p) for p in ("bank-a", "bank_a", LONG)}) == 3


@pytest.mark.parametrize("command", ["check", "status", "history"])
def test_read_only_commands_on_a_missing_database_fail_in_one_line(command: str,
                                                                   data_dir: Path) -> None:
    """``check --id`` with a typo created an empty database and printed a traceback."""
    before = databases(data_dir)
    code, out = cli(*COMMANDS[command]("bank-typo", data_dir))
    assert code == 2 and out.count("\n") == 1, out
    assert out.startswith("error: participant bank-typo has no database at ") and \
        "run `cues participant migrate --id bank-typo`" in out, out
    assert databases(data_dir) == before  # nothing created


def test_read_only_commands_start_no_server_in_an_empty_data_dir(tmp_path: Path) -> None:
    code, out = cli("status", "--id", "bank-a", "--data-dir", str(tmp_path / "none"))
    assert code == 2 and "has no database at" in out and "(no PostgreSQL there)" in out, out
    assert not (tmp_path / "none").exists()


def test_read_only_commands_on_a_dsn_without_the_schema(make_db) -> None:  # noqa: ANN001
    dsn = make_db("bank-q")
    code, out = cli("check", "--id", "bank-q", "--role", "producer", "--dsn", dsn)
    assert code == 2 and "has no database at the given --dsn (no cues schema in it)" in out, out
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                            ).fetchone()[0] == 0
