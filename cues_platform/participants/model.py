"""The message model of seed 002: statuses, queue schemas, settings.

Seed 002 gives the ack statuses as "nacked posting, nacked result / acked posting, nacked
posting" (garbled). We model the ack status as the furthest acknowledgement the SENDER has seen:

| ack status       | seed wording              | meaning                                            |
|------------------|---------------------------|----------------------------------------------------|
| `nacked_posting` | nacked posting            | recorded in the DB, POSTINGS has not acked it yet  |
| `acked_posting`  | acked posting, nacked result | POSTINGS acked; no result received yet          |
| `acked_result`   | acked result              | the result arrived from RESULTS and is recorded    |

The processing status is `PENDING` until the result arrives, then `OK` or `REJECTED`.
The status of a message is the pair (ack status, processing status).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import pyarrow as pa

from cues_platform.participants import config as cfg

POSTINGS = "postings"
RESULTS = "results"
UTC_TS = pa.timestamp("us", tz="UTC")


class AckStatus(StrEnum):
    NACKED_POSTING = "nacked_posting"
    ACKED_POSTING = "acked_posting"
    ACKED_RESULT = "acked_result"


class ProcessingStatus(StrEnum):
    PENDING = "PENDING"
    OK = "OK"
    REJECTED = "REJECTED"


class Role(StrEnum):
    PRODUCER = "producer"
    CONSUMER = "consumer"


# REJECTED reasons written by the consumer
PAYLOAD_TOO_LARGE = "payload_too_large"
PAYLOAD_NOT_JSON = "payload_not_json"
EMPTY_MESSAGE_ID = "empty_message_id"
WRONG_RECEIVER = "wrong_receiver"

POSTINGS_SCHEMA = pa.schema([
    pa.field("sender", pa.string(), nullable=False),
    pa.field("receiver", pa.string(), nullable=False),
    pa.field("message_id", pa.string(), nullable=False),
    pa.field("replays", pa.int32(), nullable=False),
    pa.field("inception_datum", UTC_TS, nullable=False),
    pa.field("last_datum", UTC_TS, nullable=False),
    pa.field("payload", pa.string(), nullable=True),
])

# Nullable message_id/status: a malformed result must reach the sender and be reported there,
# not be refused at the queue boundary where nobody would see it.
RESULTS_SCHEMA = pa.schema([
    pa.field("sender", pa.string(), nullable=False),
    pa.field("receiver", pa.string(), nullable=False),
    pa.field("message_id", pa.string(), nullable=True),
    pa.field("replays", pa.int32(), nullable=True),
    pa.field("status", pa.string(), nullable=True),
    pa.field("reason", pa.string(), nullable=True),
    pa.field("processed_at", UTC_TS, nullable=True),
])


@dataclass(frozen=True)
class Settings:
    """Tunables of one participant, documented in docs/postings-protocol.md ("Operating
    participants"). Set them in a TOML file (``--config``), as ``CUES_PARTICIPANT_<FIELD>``
    variables or as options of ``cues participant run/post`` (``--publish-timeout 4`` ...);
    see ``config.py`` for the precedence and the checks."""

    max_payload_bytes: int = 64 * 1024
    publish_attempts: int = 8  # attempts before bailing (the posting stays nacked)
    publish_timeout: float = 5.0  # seconds before bailing (keep below lease_seconds)
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    lease_seconds: float = 10.0
    batch_size: int = 1000  # postings per publication (one POSTINGS commit)
    results_batch: int = 5_000
    replay_after: float = 30.0  # acked postings without a result for this long are replayed
    idle_poll: float = 0.02  # first wait when idle; doubles up to max_idle_poll
    max_idle_poll: float = 0.25
    consumer_batch: int = 5_000
    # a producer instance holding no slot (a standby) applies results at most this often; slot
    # holders apply them every round (bench_participants.py: six standbys polling took a quarter
    # of the machine from the holders)
    standby_results_every: float = 1.0
    # `cues participant run` (the supervisor): wait before restarting a failed instance, doubling
    # per consecutive failure up to the max; reset once an instance ran healthy_after seconds.
    restart_backoff_initial: float = 1.0
    restart_backoff_max: float = 60.0
    restart_healthy_after: float = 60.0
    # a publication that keeps bailing: the first retry is at once, then the slot waits
    # bail_backoff_initial * 2**(bails - 2) seconds, capped at bail_backoff_max; audit
    # ``publish_bailed`` only at bails 1, 2, 4, 8, ... and ``publish_stuck`` once at
    # bail_stuck_after bails (also logged at ERROR)
    bail_backoff_initial: float = 1.0
    bail_backoff_max: float = 60.0
    bail_stuck_after: int = 8

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            cfg.check(name, getattr(self, name), source="Settings")

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults < the file of ``$CUES_PARTICIPANT_CONFIG`` (if set) <
        ``CUES_PARTICIPANT_<FIELD>`` environment variables < ``overrides`` (None skipped)."""
        return cls.load(overrides=overrides)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Settings:
        """Defaults < the TOML file ``path`` (no environment)."""
        return cls(**cfg.read_file(cls, path))  # type: ignore[arg-type]

    @classmethod
    def load(cls, *, config: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None,
             overrides: Mapping[str, object] | None = None) -> Settings:
        """Defaults < ``config`` file (else ``$CUES_PARTICIPANT_CONFIG``) < environment <
        ``overrides``; a bad key or value raises ``SettingsError`` naming it."""
        return cls(**cfg.load(cls, config=config, env=env, overrides=overrides))  # type: ignore[arg-type]
