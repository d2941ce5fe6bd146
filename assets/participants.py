"""Postings protocol participants in Dagster: one observable asset per producer participant's
message store and an asset check that FAILS while its database holds a consistency issue (a result
for an unknown message, a duplicate or malformed result).

Not wired into ``assets/__init__.py`` by default (the reference deployment decides which
participants it runs); add ``participant_defs({"bank-a": None, ...})`` to the merge there. A
participant's DSN comes from the mapping, else ``CUES_PARTICIPANT_DSN_<ID>`` (upper case, '-' →
'_'), else the embedded server under ``CUES_PARTICIPANTS_DATA`` (default ``.cues/participants``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetSpec,
    Definitions,
    MetadataValue,
    asset_check,
)


def _dsn(participant: str, dsn: str | None) -> str:
    from cues_platform.participants.db import participant_dsn

    env = os.environ.get(f"CUES_PARTICIPANT_DSN_{participant.upper().replace('-', '_')}")
    return participant_dsn(participant, dsn=dsn or env,
                           data_dir=os.environ.get("CUES_PARTICIPANTS_DATA", ".cues/participants"))


def consistency_result(participant: str, dsn: str) -> AssetCheckResult:
    """The check's verdict for one participant database."""
    import psycopg

    from cues_platform.participants.checks import check_producer

    with psycopg.connect(dsn) as conn:
        report = check_producer(conn, participant)
    kinds: dict[str, int] = {}
    for issue in report.issues:
        kinds[issue["kind"]] = kinds.get(issue["kind"], 0) + 1
    sample = [f"{i['kind']}: {i['sender']}/{i['message_id']} {i['detail']}" for i in report.issues[:20]]
    return AssetCheckResult(
        passed=not report.issues,
        severity=AssetCheckSeverity.ERROR,
        description=("no consistency issue" if not report.issues
                     else f"{len(report.issues)} consistency issue(s): {kinds}"),
        metadata={"issues": len(report.issues), "by_kind": MetadataValue.json(kinds),
                  "sample": MetadataValue.md("\n".join(f"- {s}" for s in sample) or "-"),
                  "statuses": MetadataValue.json(report.counts)},
    )


def participant_defs(participants: Mapping[str, str | None]) -> Definitions:
    specs, checks = [], []
    for pid, dsn in participants.items():
        key = f"participant_{pid.replace('-', '_')}_messages"
        specs.append(AssetSpec(key, group_name="participants", kinds={"postgres"},
                               description=f"messages and audit trail of participant {pid}"))

        def make(pid: str = pid, dsn: str | None = dsn, key: str = key):  # noqa: ANN202
            @asset_check(asset=key, name="no_consistency_issues", blocking=False,
                         description=f"fails while participant {pid} has a consistency issue")
            def _check() -> AssetCheckResult:
                return consistency_result(pid, _dsn(pid, dsn))

            return _check

        checks.append(make())
    return Definitions(assets=specs, asset_checks=checks)
