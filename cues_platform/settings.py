"""The platform's settings: ONE typed, frozen object, and the only place that reads the environment.

Precedence, lowest first: the defaults below < the TOML file named by ``$CUES_CONFIG`` (top-level
keys named like the fields, ``lake = "s3://bucket/lake"``) < the environment variables below <
command-line values (:func:`command_line`, what ``cues demo --lake`` uses so the deployment it
loads in the same process sees its lake).

:func:`current` builds :class:`Settings` at first use and keeps it: it is built again only when one
of its variables or the command-line layer changed (tests and the jepsen time-warp set variables
while a process runs), never at import time. A bad value is a :class:`SettingError` (a
:class:`~cues_platform.errors.ConfigurationError`) naming the variable, where it came from, and
what to set instead.

Besides the named settings, three families of variables are read here on behalf of their owners:
secrets whose variable *name* is configured (:func:`secret`: a Dagster lake's
``secret_options_env``, ``CUES_PARTICIPANT_DSN_<ID>``), the participant settings
``CUES_PARTICIPANT_<FIELD>`` (:func:`environment`, parsed by ``participants/config.py``), and a
child process's environment (:func:`child_environment`). Writes for other programs (pyspark's
``PYSPARK_PYTHON``, Dagster's ``DAGSTER_HOME``, the shared ``CUES_CLOCK_FILE`` of a time-warp run)
go through :func:`export`. ``docs/settings.md`` is generated from :data:`SPECS`
(``python -m cues_platform.settings``); a test keeps them equal.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from cues_platform.errors import ConfigurationError

CONFIG_ENV = "CUES_CONFIG"
PYTHON_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")


class SettingError(ConfigurationError):
    """A setting has a bad value (``variable`` names it, ``source`` says where it came from), or
    the settings file is unreadable or names an unknown setting."""


def _setting(env: str, meaning: str, *, default: Any = None, kind: str = "text",
             choices: tuple[str, ...] = (), secret: bool = False) -> Any:
    """A field of :class:`Settings`: its variable, meaning and parsing rule in the metadata.

    ``kind``: ``text`` (an empty value counts as unset), ``optional`` (unset: None; set, even
    empty: the text, as pyspark reads its own variables), ``flag`` (unset, empty or ``0``: False;
    anything else: True), ``choice`` (one of ``choices``, any case), ``seconds`` (a whole number
    of seconds, at least 1; an empty value counts as unset)."""
    return field(default=default, repr=not secret,
                 metadata={"env": env, "meaning": meaning, "kind": kind, "choices": choices,
                           "secret": secret})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of the platform (one field each; ``docs/settings.md`` lists them)."""

    lake: str = _setting("CUES_LAKE", "the lake root: a folder or a delta-rs URI (`s3://...`); "
                         "every `cues` command's `--lake` and the deployment's lake resource",
                         default="lake")
    spark_master: str = _setting(
        "CUES_SPARK_MASTER", "Spark: `local[*]`, a cluster master (`spark://host:7077`, `yarn`, "
        "`k8s://...`) or a Spark Connect URL (`sc://host:15002`)", default="local[*]")
    spark_log_level: str = _setting("CUES_SPARK_LOG_LEVEL", "the driver JVM's log level "
                                    "(classic sessions)", default="ERROR", kind="choice",
                                    choices=SPARK_LOG_LEVELS)
    log_level: str = _setting("CUES_LOG_LEVEL", "Python log level of a participant instance "
                              "process", default="WARNING", kind="choice",
                              choices=PYTHON_LOG_LEVELS)
    debug: bool = _setting("CUES_DEBUG", "command lines print the traceback of an error too",
                           default=False, kind="flag")
    postgres_dsn: str = _setting(
        "CUES_POSTGRES_DSN", "the ledger's (and `cues participant`'s) PostgreSQL; unset: an "
        "embedded server (pgserver). Secret: never printed", default="", secret=True)
    postgres_dir: str = _setting("CUES_POSTGRES_DIR", "the embedded PostgreSQL's data folder of "
                                 "the deployment's ledger", default=".cues/postgres")
    participants: str | None = _setting(
        "CUES_PARTICIPANTS", "the deployment's participants, `id:role,...` (unset: "
        "`assets/participants.py`'s DEFAULT_PARTICIPANTS)", kind="optional")
    participants_lake: str = _setting("CUES_PARTICIPANTS_LAKE", "the postings protocol's lake "
                                      "in the deployment", default="lake-participants")
    participants_data: str = _setting("CUES_PARTICIPANTS_DATA", "the participants' embedded "
                                      "PostgreSQL folder in the deployment",
                                      default=".cues/participants")
    clock_file: str | None = _setting(
        "CUES_CLOCK_FILE", "a shared platform clock offset file (the jepsen time nemesis; "
        "`clock.py`); unset: real time", kind="optional")
    sensor_interval: int = _setting(
        "CUES_SENSOR_INTERVAL", "seconds between two ticks of each sensor of the Dagster deployment "
        "(`minimum_interval_seconds`: the processors' new-data, sink, on-demand and recovery "
        "sensors and the participants' sensors)", default=30, kind="seconds")
    dagster_home: str | None = _setting(
        "DAGSTER_HOME", "the Dagster instance of `cues demo` (unset: the project's "
        "`dagster_home/`)", kind="optional")
    java_home: str | None = _setting("JAVA_HOME", "the Java Spark runs (unset: `java` on PATH)",
                                     kind="optional")
    spark_api_mode: str | None = _setting(
        "SPARK_API_MODE", "pyspark's own: `classic` or `connect` (read to know whether a "
        "session starts a driver JVM)", kind="optional")
    spark_remote: str | None = _setting("SPARK_REMOTE", "pyspark's own: a Spark Connect URL "
                                        "(set: Spark Connect)", kind="optional")
    spark_connect_mode_enabled: str | None = _setting(
        "SPARK_CONNECT_MODE_ENABLED", "pyspark's own (set: Spark Connect)", kind="optional")
    spark_local_remote: str | None = _setting("SPARK_LOCAL_REMOTE", "pyspark's own (set: Spark "
                                              "Connect)", kind="optional")


@dataclass(frozen=True)
class Spec:
    """One setting as documented: field name, variable, default, meaning."""

    name: str
    env: str
    default: Any
    kind: str
    choices: tuple[str, ...]
    secret: bool
    meaning: str


SPECS: tuple[Spec, ...] = tuple(
    Spec(f.name, f.metadata["env"], f.default, f.metadata["kind"], f.metadata["choices"],
         f.metadata["secret"], f.metadata["meaning"]) for f in fields(Settings))
DEFAULTS = Settings()
_BY_NAME = {s.name: s for s in SPECS}


def parse(spec: Spec, raw: object, *, source: str) -> Any:
    """The value of ``spec`` from text (environment, option) or TOML, or a SettingError."""
    def bad(why: str) -> SettingError:
        shown = "<secret>" if spec.secret else repr(raw)
        return SettingError(
            f"bad value {shown} for {spec.env} ({source}): {why}; set {spec.env} to a valid "
            f"value or unset it (default: {spec.default!r}; docs/settings.md)",
            variable=spec.env, setting=spec.name, source=source)

    if spec.kind == "seconds" and isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)  # TOML: sensor_interval = 5
    if spec.kind == "flag":
        if isinstance(raw, bool):
            return raw
        if not isinstance(raw, str):
            raise bad("expected true or false")
        return raw.strip() not in ("", "0")
    if not isinstance(raw, str):
        raise bad(f"expected text, got {type(raw).__name__}")
    if spec.kind == "optional":
        return raw
    value = raw.strip()
    if not value:
        return spec.default
    if spec.kind == "choice":
        upper = value.upper()
        if upper not in spec.choices:
            raise bad(f"expected one of {', '.join(spec.choices)}")
        return upper
    if spec.kind == "seconds":
        if not value.isdigit() or int(value) < 1:
            raise bad("expected a whole number of seconds, at least 1")
        return int(value)
    return value


def read_file(path: str | Path) -> dict[str, Any]:
    """The settings of a TOML file (keys: field names), checked key by key."""
    source = f"config file {path}"
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise SettingError(f"cannot read the settings {source} (${CONFIG_ENV}): "
                           f"{exc.strerror or exc}; fix the path or unset {CONFIG_ENV}",
                           variable=CONFIG_ENV, setting=None, source=source) from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"the settings {source} is not valid TOML ({exc}): fix it or unset "
                           f"{CONFIG_ENV}", variable=CONFIG_ENV, setting=None,
                           source=source) from exc
    out: dict[str, Any] = {}
    for key, raw in data.items():
        spec = _BY_NAME.get(key)
        if spec is None:
            raise SettingError(f"unknown setting {key!r} in {source}; known: "
                               f"{', '.join(sorted(_BY_NAME))}", variable=CONFIG_ENV,
                               setting=key, source=source)
        out[key] = parse(spec, raw, source=source)
    return out


def load(*, env: Mapping[str, str], file: str | Path | None = None,
         command_line: Mapping[str, Any] | None = None) -> Settings:
    """Settings from defaults < ``file`` (else ``env[CUES_CONFIG]``) < ``env`` < ``command_line``
    (None values skipped). Pure: reads only what it is given (and the file)."""
    values: dict[str, Any] = {}
    path = file or env.get(CONFIG_ENV) or None
    if path:
        values.update(read_file(path))
    for spec in SPECS:
        if spec.env in env:
            raw = env[spec.env]
            if spec.kind == "optional" or raw.strip():
                values[spec.name] = parse(spec, raw, source="environment variable")
    for key, raw in (command_line or {}).items():
        if raw is None:
            continue
        spec = _BY_NAME.get(key)
        if spec is None:
            raise SettingError(f"unknown setting {key!r} on the command line",
                               variable=None, setting=key, source="command line")
        values[key] = parse(spec, raw, source="command line")
    return replace(DEFAULTS, **values)


_command_line: dict[str, Any] = {}
_cache: tuple[tuple[Any, ...], Settings] | None = None
loads = 0  # how many times current() built the settings (the no-read-at-import test reads it)


def current() -> Settings:
    """This process's settings: built at first use, again only when an input changed."""
    global _cache, loads
    env = os.environ
    key = (tuple(env.get(s.env) for s in SPECS), env.get(CONFIG_ENV),
           tuple(sorted(_command_line.items())))
    if _cache is not None and _cache[0] == key:
        return _cache[1]
    built = load(env=env, command_line=_command_line)
    loads += 1
    _cache = (key, built)
    return built


@contextmanager
def command_line(**values: Any) -> Iterator[Settings]:
    """The command-line layer (highest precedence) of this process while the block runs: ``cues
    demo --lake X`` runs the Dagster deployment in-process inside ``command_line(lake=X)``, so the
    deployment's lake resource opens X. None values are skipped. Yields the settings in force."""
    for key, value in values.items():
        if key not in _BY_NAME:
            raise SettingError(f"unknown setting {key!r} on the command line", variable=None,
                               setting=key, source="command line")
        if value is not None:
            parse(_BY_NAME[key], value, source="command line")
    saved = dict(_command_line)
    _command_line.update({k: v for k, v in values.items() if v is not None})
    try:
        yield current()
    finally:
        _command_line.clear()
        _command_line.update(saved)


def secret(variable: str) -> str | None:
    """The value of an environment variable whose *name* is configured (a secret: callers never
    log it), or None when it is unset. Read at call time, in the process that needs it."""
    return os.environ.get(variable)


def environment() -> Mapping[str, str]:
    """A read-only copy of the environment, for settings families parsed by their owners
    (``CUES_PARTICIPANT_<FIELD>``: ``participants/config.py``)."""
    return dict(os.environ)


def child_environment(extra: Mapping[str, str] | None = None, *,
                      without: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment for a child process: this one's, minus ``without``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in without}
    env.update(extra or {})
    return env


def export(variable: str, value: str, *, keep_existing: bool = False) -> None:
    """Set ``variable`` for this process's libraries and its children (pyspark's
    ``PYSPARK_PYTHON``, Dagster's ``DAGSTER_HOME``, the shared ``CUES_CLOCK_FILE``); with
    ``keep_existing`` a value the user set wins."""
    if keep_existing:
        os.environ.setdefault(variable, value)
    else:
        os.environ[variable] = value


@contextmanager
def exported(variable: str, value: str) -> Iterator[None]:
    """``variable`` set to ``value`` for the block (a library reading it, e.g. a Dagster
    instance's dagster.yaml naming ``DAGSTER_HOME``), then put back as it was (or unset)."""
    before = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before


def markdown_table() -> str:
    """The table of ``docs/settings.md``: one row per setting, from :data:`SPECS`."""
    rows = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    for s in SPECS:
        default = ("unset" if s.default is None else "empty" if s.default == ""
                   else f"`{s.default}`")
        meaning = s.meaning + (f" (one of {', '.join(s.choices)})" if s.choices else "")
        rows.append(f"| `{s.name}` | `{s.env}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


DOC_HEADER = """# Settings

One typed object, `cues_platform.settings.Settings`, holds every setting of the platform; every
command line, Dagster resource and runner reads it through `cues_platform.settings.current()`,
and no other module reads the environment.

Precedence, lowest first: the default < the TOML file named by `$CUES_CONFIG` (top-level keys named
like the settings, e.g. `lake = "s3://bucket/lake"`) < the environment variable < the command
line (`--lake`, ...). The settings are built at first use, never at import time, and again only
when one of their inputs changes. A bad value stops the command with one line naming the variable
and what to set instead (`SettingError`, a `ConfigurationError`). An empty variable counts as
unset, except for those whose default is "unset" (pyspark reads its own variables the same way).

This table is generated from `cues_platform/settings.py` (`python -m cues_platform.settings >
docs/settings.md`); `tests/test_settings.py` checks that it matches the code.

"""

DOC_FOOTER = """
Read by their owners through the same module:

- `CUES_PARTICIPANT_<FIELD>` and `CUES_PARTICIPANT_CONFIG`: a participant instance's settings
  (`participants/config.py`, `docs/postings-protocol.md`).
- `CUES_PARTICIPANT_DSN_<ID>`: one participant's database in the deployment (a secret).
- The variables named in a `LakeResource`'s `secret_options_env` (object-store secrets), read in
  the run process only (`cues_platform/dagster/resources.py`).
"""


def document() -> str:
    """The whole of ``docs/settings.md``."""
    return DOC_HEADER + markdown_table() + DOC_FOOTER


if __name__ == "__main__":
    print(document(), end="")
