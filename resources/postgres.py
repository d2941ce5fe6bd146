"""The ledger's PostgreSQL: ``CUES_POSTGRES_DSN`` if set, else an embedded server (pgserver).

The DSN comes through :class:`dagster.EnvVar`, so Dagster resolves it in the run process and never
stores it (it may hold a password). Without it, the first connection starts (or reuses) the
embedded PostgreSQL whose data directory is ``data_dir`` (``$CUES_POSTGRES_DIR``, default
``.cues/postgres`` under the project); it keeps running after the run so later runs and ``psql`` reach the same ledger.
"""

from __future__ import annotations

import os
from typing import Any

from dagster import ConfigurableResource, EnvVar
from pydantic import Field, PrivateAttr

from cues_platform.pgserver_db import DSN_ENV, embedded_postgres
from cues_platform.reference.ledger import DEFAULT_SCHEMA, LedgerDB

DEFAULT_DATA_DIR = ".cues/postgres"
DATA_DIR_ENV = "CUES_POSTGRES_DIR"


class LedgerResource(ConfigurableResource):
    """The ledger sink's database; processor functions get it as ``ctx.resources["ledger"]``."""

    dsn: str = Field(default="", description="PostgreSQL DSN; empty: the embedded server")
    data_dir: str = Field(default=DEFAULT_DATA_DIR, description="embedded server's data directory")
    ledger_schema: str = Field(default=DEFAULT_SCHEMA, description="PostgreSQL schema of the ledger")
    _db: Any = PrivateAttr(default=None)

    def db(self) -> LedgerDB:
        if self._db is None:
            self._db = LedgerDB(self.dsn or embedded_postgres(self.data_dir), schema=self.ledger_schema)
        return self._db

    def connect(self, **kwargs: Any) -> Any:
        return self.db().connect(**kwargs)


def ledger_resource() -> LedgerResource:
    if os.environ.get(DSN_ENV, "").strip():
        return LedgerResource(dsn=EnvVar(DSN_ENV))
    if os.environ.get(DATA_DIR_ENV, "").strip():
        return LedgerResource(data_dir=EnvVar(DATA_DIR_ENV))
    return LedgerResource()


ledger = ledger_resource()
