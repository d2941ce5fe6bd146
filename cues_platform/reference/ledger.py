"""The ledger in PostgreSQL: entries and balances, booked once per delivery.

Tables live in their own PostgreSQL schema (``cues_ledger`` by default), so a deployment can point
``CUES_POSTGRES_DSN`` at a shared server:

- ``entries``: one row per OK posting (``entry_id`` = ``sender/message_id`` is the primary key, a
  second booking of the same posting would fail loudly), with the delivery hash that booked it;
- ``balances``: every account of the directory, its opening balance and its current balance;
- ``deliveries``: the delivery hashes applied (:func:`cues_platform.processing.sinks.postgres_once`).

A delivery books its entries and moves the balances in the same transaction as its hash row, so a
retried delivery (same hash) changes nothing. Balances always sum to the openings (double entry).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from cues_platform.errors import ConfigurationError
from cues_platform.processing.sinks import postgres_once

DEFAULT_SCHEMA = "cues_ledger"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class LedgerDB:
    """Where the ledger lives: a DSN (may hold a password: never logged) and a schema name."""

    dsn: str
    schema: str = DEFAULT_SCHEMA

    def __post_init__(self) -> None:
        if not _SCHEMA_NAME.fullmatch(self.schema):
            raise ConfigurationError(f"invalid ledger schema name {self.schema!r}: use 1-63 lowercase "
                                     "letters, digits or underscores, not starting with a digit")

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        conn = psycopg.connect(self.dsn, **kwargs)
        ensure_schema(conn, self.schema)
        return conn

    def drop(self) -> None:
        """Drop the ledger's schema (a fresh demo or test); never used by the pipeline itself."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))


def ensure_schema(conn: psycopg.Connection, schema: str) -> None:
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(sql.SQL("SET search_path TO {}").format(ident))
        conn.execute("""CREATE TABLE IF NOT EXISTS entries (
            entry_id text PRIMARY KEY, sender text NOT NULL, receiver text NOT NULL,
            debtor_account text NOT NULL, creditor_account text NOT NULL,
            amount numeric(18,2) NOT NULL, value_date date NOT NULL,
            posting_partition text NOT NULL, posting_offset bigint NOT NULL,
            delivery_hash text NOT NULL, booked_at timestamptz NOT NULL DEFAULT now())""")
        conn.execute("""CREATE TABLE IF NOT EXISTS balances (
            account text PRIMARY KEY, participant text NOT NULL,
            opening numeric(18,2) NOT NULL, balance numeric(18,2) NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now())""")
    if not conn.autocommit:
        conn.commit()


def book(ctx: Any, db: LedgerDB | Any, entries: pa.Table) -> bool:
    """Book ``entries`` (schema ``LEDGER_ENTRIES``) once for this delivery; True if booked now."""
    directory = ctx.lake.queue("accounts").read_arrow(
        partition="0", columns=["account", "participant", "opening_balance"]).to_pylist()
    rows = entries.to_pylist()
    deltas: dict[str, Decimal] = {}
    for r in rows:
        deltas[r["debtor_account"]] = deltas.get(r["debtor_account"], Decimal(0)) - r["amount"]
        deltas[r["creditor_account"]] = deltas.get(r["creditor_account"], Decimal(0)) + r["amount"]
    with db.connect() as conn, postgres_once(ctx, conn, table="deliveries") as delivery:
        if not delivery.first_time:
            return False
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO balances (account, participant, opening, balance) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (account) DO NOTHING",
                [(d["account"], d["participant"], d["opening_balance"], d["opening_balance"]) for d in directory])
            cur.executemany(
                "INSERT INTO entries (entry_id, sender, receiver, debtor_account, creditor_account, amount, "
                "value_date, posting_partition, posting_offset, delivery_hash) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(r["entry_id"], r["sender"], r["receiver"], r["debtor_account"], r["creditor_account"],
                  r["amount"], r["value_date"], r["posting_partition"], r["posting_offset"],
                  ctx.delivery_hash) for r in rows])
            cur.executemany(
                "UPDATE balances SET balance = balance + %s, updated_at = now() WHERE account = %s",
                [(delta, acct) for acct, delta in sorted(deltas.items())])
    return True


@dataclass(frozen=True)
class LedgerTotals:
    entries: int
    amount: Decimal
    deliveries: int
    accounts: int
    opening: Decimal
    balance: Decimal

    @property
    def balanced(self) -> bool:
        return self.opening == self.balance


def totals(db: LedgerDB) -> LedgerTotals:
    with db.connect() as conn:
        n, amount = conn.execute("SELECT count(*), coalesce(sum(amount), 0) FROM entries").fetchone()
        accounts, opening, balance = conn.execute(
            "SELECT count(*), coalesce(sum(opening), 0), coalesce(sum(balance), 0) FROM balances").fetchone()
        deliveries = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s AND table_name = 'deliveries'",
            (db.schema,)).fetchone()[0]
        if deliveries:
            deliveries = conn.execute("SELECT count(*) FROM deliveries").fetchone()[0]
    return LedgerTotals(n, Decimal(amount), deliveries, accounts, Decimal(opening), Decimal(balance))


def balances(db: LedgerDB) -> dict[str, Decimal]:
    with db.connect() as conn:
        return {a: Decimal(b) for a, b in conn.execute("SELECT account, balance FROM balances")}
