"""Loading participant settings (``model.Settings``) from a TOML file, the environment and options.

Precedence, lowest first: the defaults of ``model.Settings`` < the config file (``--config FILE``,
else ``$CUES_PARTICIPANT_CONFIG``) < ``CUES_PARTICIPANT_<FIELD>`` environment variables < CLI
options. The file holds top-level keys named like the fields::

    publish_timeout = 4.0
    replay_after = 120
    batch_size = 500

An unknown key in the file, a value of the wrong type, a negative number or an unreadable file is a
:class:`SettingsError` naming the key and where it came from (one line on the command line).
Environment variables that name no field are ignored (the environment is shared, e.g.
``CUES_PARTICIPANT_DSN_<ID>`` of the Dagster assets). The environment is read through
``cues_platform.settings`` (the platform's one settings place, whose own settings follow the same
precedence), at call time, never at import time.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from cues_platform.participants.errors import SettingsError
from cues_platform.settings import environment

ENV_PREFIX = "CUES_PARTICIPANT_"
CONFIG_ENV = "CUES_PARTICIPANT_CONFIG"
# Floats that must be > 0 (others may be 0, e.g. replay_after = 0 replays at once); ints are >= 1.
POSITIVE = frozenset({"lease_seconds", "publish_timeout", "backoff_max", "max_idle_poll",
                      "restart_backoff_max", "bail_backoff_max"})


def field_types(cls: type) -> dict[str, type]:
    """Field name -> type of its default (int, float, bool or str)."""
    return {f.name: type(f.default) for f in fields(cls)}


def coerce(cls: type, key: str, value: object, *, source: str) -> object:
    """``value`` for field ``key`` of ``cls`` (from text or TOML), or a SettingsError."""
    types = field_types(cls)
    if key not in types:
        raise SettingsError(
            f"unknown setting {key!r} in {source}; known: {', '.join(sorted(types))}",
            key=key, source=source,
        )
    typ = types[key]
    try:
        out = _convert(typ, value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(
            f"bad value {value!r} for setting {key!r} in {source}: {exc}", key=key, source=source,
        ) from exc
    check(key, out, source=source)
    return out


def _convert(typ: type, value: object) -> object:
    if typ is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected true or false")
    if isinstance(value, bool):  # bool is an int in Python: never a number setting
        raise TypeError(f"expected {typ.__name__}, got a boolean")
    if typ is int:
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            return int(value.strip())
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if typ is float:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
        raise TypeError(f"expected a number, got {type(value).__name__}")
    if typ is str and isinstance(value, str):
        return value
    raise TypeError(f"expected {typ.__name__}, got {type(value).__name__}")


def check(key: str, value: object, *, source: str) -> None:
    """Range rules: ints >= 1; floats finite and >= 0 (> 0 for the ones in ``POSITIVE``)."""
    problem = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, int) and value < 1:
        problem = "must be an integer >= 1"
    elif isinstance(value, float) and not math.isfinite(value):
        problem = "must be a finite number"
    elif isinstance(value, float) and key in POSITIVE and value <= 0:
        problem = "must be > 0 (seconds)"
    elif isinstance(value, float) and value < 0:
        problem = "must be >= 0 (seconds)"
    if problem:
        raise SettingsError(f"bad value {value!r} for setting {key!r} in {source}: {problem}",
                            key=key, source=source)


def read_file(cls: type, path: str | Path) -> dict[str, object]:
    """The settings of a TOML file, checked key by key."""
    source = f"config file {path}"
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise SettingsError(f"cannot read {source}: {exc.strerror or exc}", key=None,
                            source=source) from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{source} is not valid TOML: {exc}", key=None, source=source) from exc
    return {key: coerce(cls, key, value, source=source) for key, value in data.items()}


def read_env(cls: type, env: Mapping[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in field_types(cls):
        raw = env.get(ENV_PREFIX + key.upper())
        if raw:
            out[key] = coerce(cls, key, raw, source=f"${ENV_PREFIX}{key.upper()}")
    return out


def load(cls: type, *, config: str | Path | None = None, env: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> dict[str, object]:
    """The field values of ``cls`` from file < environment < overrides (None values skipped)."""
    env = environment() if env is None else env
    values: dict[str, object] = {}
    path = config or env.get(CONFIG_ENV) or None
    if path:
        values.update(read_file(cls, path))
    values.update(read_env(cls, env))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = coerce(cls, key, value, source=f"option --{key.replace('_', '-')}")
    return values


def to_env(settings: object) -> dict[str, str]:
    """``CUES_PARTICIPANT_<FIELD>`` variables for every field: how ``run`` hands the resolved
    settings to its instances (which read them with ``Settings.from_env``)."""
    return {ENV_PREFIX + f.name.upper(): str(getattr(settings, f.name)) for f in fields(settings)}  # type: ignore[arg-type]
