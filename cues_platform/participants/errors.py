"""Typed errors of the postings protocol (all under :class:`cues_platform.errors.CuesError`)."""

from __future__ import annotations

from cues_platform.errors import CuesError


class ParticipantError(CuesError):
    """Root of the postings protocol's errors."""


class ParticipantConfigError(ParticipantError):
    """A participant id, role, DSN or setting is invalid."""


class UnknownParticipantError(ParticipantError):
    """The participant is not registered on the network (no POSTINGS/RESULTS subject for it)."""


class DuplicateMessageError(ParticipantError):
    """The sender already recorded this message id (ids are unique per sender); nothing written."""


class PayloadTooLargeError(ParticipantError):
    """The payload exceeds ``max_payload_bytes``; nothing written."""


class InvalidPostingError(ParticipantError):
    """A posting is malformed (empty message id, payload not a string, ...); nothing written."""


class LeaseLostError(ParticipantError):
    """This instance no longer holds the lease it acted under (it expired and was taken over);
    its write was refused. Retrying under a fresh lease is safe."""

    retryable = True


class PublishBailedError(ParticipantError):
    """Publishing to POSTINGS was not acknowledged within the attempts/timeout; the posting stays
    nacked in the DB with its real retries, and is published again later (never twice)."""

    retryable = True


class DatabaseUnavailableError(ParticipantError):
    """The participant's PostgreSQL kept failing; the last transaction's outcome is unknown and
    every protocol transaction is safe to retry."""

    retryable = True


class ConsistencyIssueError(ParticipantError):
    """A consistency issue was found (e.g. a result for a message the sender does not know).
    Issues are also stored in the ``consistency_issues`` table and fail the asset check."""


class PassFailedError(ParticipantError):
    """One bounded pass (``once.run_once``) could not finish its work: consumer steps or the
    processor's recovery kept failing. Nothing is lost or doubled; the next pass or a running
    instance recovers and continues."""

    retryable = True


class MissingDatabaseError(ParticipantConfigError):
    """A read-only command (check, status, history) found no database (or no schema) for the
    participant; nothing was created. Run ``cues participant migrate --id ID`` first."""


class SettingsError(ParticipantConfigError):
    """A participant setting (config file, ``CUES_PARTICIPANT_*`` variable or CLI option) is
    unknown or has a bad value; ``key`` names it, ``source`` says where it came from."""


class MessageNotFoundError(ParticipantError):
    """``history``: the sender's database has no posting with this message id."""
