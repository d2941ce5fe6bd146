"""The ledger's PostgreSQL: ``CUES_POSTGRES_DSN`` if set, else an embedded server (pgserver).

The DSN is read from ``cues_platform.settings`` in the run process when the ledger first connects,
so Dagster never stores it and never shows it (it may hold a password). Without it, the first
connection starts (or reuses) the embedded PostgreSQL whose data directory is ``data_dir`` (unset:
``$CUES_POSTGRES_DIR``, default ``.cues/postgres`` under the project); it keeps running after the run so later runs and ``psql`` reach the same ledger.
"""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from cues_platform.pgserver_db import embedded_postgres
from cues_platform.reference.ledger import DEFAULT_SCHEMA, LedgerDB
from cues_platform.settings import DEFAULTS, current

DEFAULT_DATA_DIR = DEFAULTS.postgres_dir
DATA_DIR_ENV = "CUES_POSTGRES_DIR"


class LedgerResource(ConfigurableResource):
    """The ledger sink's database; processor functions get it as ``ctx.resources["ledger"]``."""

    dsn: str = Field(default="", description="PostgreSQL DSN; empty: $CUES_POSTGRES_DSN in the run "
                     "process, else the embedded server")
    data_dir: str = Field(default="", description="embedded server's data directory; empty: "
                          f"$CUES_POSTGRES_DIR or {DEFAULT_DATA_DIR}")
    ledger_schema: str = Field(default=DEFAULT_SCHEMA, description="PostgreSQL schema of the ledger")
    _db: Any = PrivateAttr(default=None)

    def db(self) -> LedgerDB:
        if self._db is None:
            settings = current()
            dsn = self.dsn or settings.postgres_dsn  # never logged
            self._db = LedgerDB(dsn or embedded_postgres(self.data_dir or settings.postgres_dir),
                                schema=self.ledger_schema)
        return self._db

    def connect(self, **kwargs: Any) -> Any:
        return self.db().connect(**kwargs)


def ledger_resource() -> LedgerResource:
    """``$CUES_POSTGRES_DSN`` or the embedded server in ``$CUES_POSTGRES_DIR``, both read by the run."""
    return LedgerResource()


ledger = ledger_resource()
