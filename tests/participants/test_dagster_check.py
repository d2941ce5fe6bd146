"""The Dagster asset check fails on a stored consistency issue and passes without one."""

from __future__ import annotations

from collections.abc import Callable

from dagster import Definitions

from assets.participants import consistency_result, participant_defs
from cues_platform.participants.db import Database
from cues_platform.participants.trail import record_issue


def test_asset_check_fails_on_consistency_issue(make_db: Callable[[str], str]) -> None:
    dsn = make_db("bank-a")
    db = Database(dsn)
    db.migrate()
    assert consistency_result("bank-a", dsn).passed
    db.run(lambda c: record_issue(c, "unknown_message", instance="t", sender="bank-a",
                                  message_id="ghost", offset=0))
    result = consistency_result("bank-a", dsn)
    assert not result.passed and result.metadata["issues"].value == 1
    defs = participant_defs({"bank-a": dsn})
    assert isinstance(defs, Definitions)
    check = next(iter(defs.asset_checks))
    direct = check()
    assert direct.passed is False
    db.close()
