"""Issue 10 item 6: participant settings from a TOML file, the environment and CLI options, with
one precedence rule and one-line errors naming the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cues_platform.participants.cli import participant
from cues_platform.participants.config import to_env
from cues_platform.participants.errors import SettingsError
from cues_platform.participants.model import Settings


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "participant.toml"
    path.write_text(text)
    return str(path)


def test_precedence_defaults_file_env_options(tmp_path: Path) -> None:
    config = write(tmp_path, "publish_timeout = 4\nreplay_after = 120.5\nbatch_size = 500\n")
    env = {"CUES_PARTICIPANT_REPLAY_AFTER": "60", "CUES_PARTICIPANT_BATCH_SIZE": "200",
           "CUES_PARTICIPANT_DSN_BANK_A": "postgresql://ignored"}  # not a setting: ignored
    s = Settings.load(config=config, env=env, overrides={"batch_size": 50, "lease_seconds": None})
    assert (s.publish_timeout, s.replay_after, s.batch_size) == (4.0, 60.0, 50)
    assert s.lease_seconds == Settings().lease_seconds  # default kept (None = not given)
    assert Settings.from_file(config).replay_after == 120.5
    # the config file named by $CUES_PARTICIPANT_CONFIG, what instances read
    assert Settings.load(env={"CUES_PARTICIPANT_CONFIG": config}).batch_size == 500
    # what `run` hands to its instances reads back to the same settings
    assert Settings.load(env=to_env(s)) == s


@pytest.mark.parametrize(("text", "message"), [
    ("publish_timout = 4\n", "unknown setting 'publish_timout' in config file"),
    ('batch_size = "ten"\n', "bad value 'ten' for setting 'batch_size' in config file"),
    ("batch_size = 2.5\n", "bad value 2.5 for setting 'batch_size'"),
    ("replay_after = -1\n", "bad value -1.0 for setting 'replay_after' in config file"),
    ("lease_seconds = 0\n", "setting 'lease_seconds' in config file"),
    ("batch_size = true\n", "bad value True for setting 'batch_size'"),
    ("batch_size = \n", "is not valid TOML"),
])
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = write(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        Settings.load(config=config, env={})
    assert message in str(err.value)
    out = CliRunner().invoke(participant, ["post", "--id", "bank-a", "--to", "bank-x",
                                           "--config", config, "--data-dir", str(tmp_path)])
    assert out.exit_code == 2 and out.output.startswith("error: ") and message in out.output
    assert out.output.count("\n") == 1, out.output
    assert not (tmp_path / "pg").exists()  # refused before any database was touched


def test_bad_env_and_option_values_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"'publish_timeout' in \$CUES_PARTICIPANT_PUBLISH_T"):
        Settings.load(env={"CUES_PARTICIPANT_PUBLISH_TIMEOUT": "soon"})
    out = CliRunner().invoke(participant, ["run", "--id", "bank-a", "--role", "producer",
                                           "--replay-after", "-5", "--data-dir", str(tmp_path)])
    assert out.exit_code == 2 and "'replay_after' in option --replay-after" in out.output, out.output
    missing = CliRunner().invoke(participant, ["run", "--id", "bank-a", "--role", "producer",
                                               "--config", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and "cannot read config file" in missing.output


def test_every_setting_is_a_documented_cli_option() -> None:
    help_text = CliRunner().invoke(participant, ["run", "--help"], terminal_width=200).output
    for name in Settings.__dataclass_fields__:
        assert f"--{name.replace('_', '-')}" in help_text
    assert "--config" in help_text
    doc = (Path(__file__).resolve().parents[2] / "docs" / "postings-protocol.md").read_text()
    for name in Settings.__dataclass_fields__:
        assert f"`{name}`" in doc, f"{name} is not documented in docs/postings-protocol.md"
