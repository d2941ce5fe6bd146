"""``cues txn …``: the lake's open producer transactions, and an operator's abort of one.

``cues txn list`` prints every transaction the coordinator (``_cues/transactions``) holds open:
its id, transactional id, epoch, age, deadline and the queues its sends registered; it first
aborts those already past their deadline (the same sweep as maintenance), so what it prints is
what still holds read_committed readers back. ``cues txn abort ID --yes`` aborts one now: the
same fenced coordinator decision as a timeout (``queues/transactions.py``), so its owner's later
commit fails with ProducerFencedError. ``cues_platform/cli/root.py`` adds this group to ``cues``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
from rich.table import Table

from cues_platform.cli.common import console, lake_option, open_lake
from cues_platform.clock import now_ms
from cues_platform.errors import ConfigurationError
from cues_platform.queues.coordinator import abort_expired, abort_transaction, open_transactions


@click.group("txn")
def txn() -> None:
    """Open producer transactions (what holds read_committed readers back) and aborting one."""


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@txn.command("list")
@lake_option
def txn_list(lake_root: str) -> None:
    """Open transactions: id, transactional id, epoch, age, deadline, queues."""
    lake = open_lake(lake_root)
    expired = abort_expired(lake)
    if expired:
        console.print(f"aborted past their deadline: {', '.join(expired)}")
    now = now_ms()
    table = Table("id", "transactional id", "epoch", "age (s)", "deadline", "queues")
    for t in open_transactions(lake):
        table.add_row(t.txn_id, t.transactional_id, str(t.epoch), f"{t.age_s(now):.1f}",
                      _when(t.deadline_ms), ", ".join(t.queues) or "-")
    console.print(table)


@txn.command("abort")
@click.argument("txn_id")
@click.option("--yes", is_flag=True, help="Confirm: the transaction's rows never become visible.")
@lake_option
def txn_abort(txn_id: str, yes: bool, lake_root: str) -> None:
    """Abort the open transaction TXN_ID now (its owner is fenced: its commit fails)."""
    if not yes:
        raise ConfigurationError(
            f"aborting transaction {txn_id!r} discards its rows for read_committed readers and "
            "fences its producer (its commit will fail): pass --yes to confirm", txn_id=txn_id)
    abort_transaction(open_lake(lake_root), txn_id)
    console.print(f"aborted {txn_id}")


__all__ = ["txn"]
