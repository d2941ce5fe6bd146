"""An embedded PostgreSQL for development and tests, started by the ``pgserver`` package.

``pgserver`` ships PostgreSQL binaries in its wheel, runs ``initdb`` on an empty data directory and
starts a server that listens on a Unix socket inside (or next to) that directory only. As root it
runs the server as a ``pgserver`` system user, creating it if needed.

Lifecycle contract of :func:`embedded_postgres`:

1. Create the data directory's parent if missing; ``initdb`` the directory if it is not a cluster.
2. Start the server unless one is already running on that directory (then reuse it).
3. Return its DSN (``postgresql://postgres:@/postgres?host=<socket dir>``, trust auth).

The server is started with ``cleanup_mode=None``: it outlives this process, so DSNs handed to child
processes keep working; :func:`stop_embedded_postgres` stops it. If the process dies during step 1
or 2, the next call finds the half-made directory: ``initdb`` is redone only if ``PG_VERSION`` is
missing, and a stale ``postmaster.pid`` is ignored.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from cues_platform.errors import ConfigurationError
from cues_platform.settings import current

DSN_ENV = "CUES_POSTGRES_DSN"


def _resolve(data_dir: str | Path) -> Path:
    return Path(data_dir).expanduser().resolve()


def embedded_postgres(data_dir: str | Path, *, database: str | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL on ``data_dir`` and return its DSN."""
    with warnings.catch_warnings():  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver

    path = _resolve(data_dir)
    # Step 1
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the parent of the PostgreSQL data directory {path}: {exc}",
            data_dir=str(path),
        ) from exc
    # Step 2
    server = pgserver.get_server(path, cleanup_mode=None)
    # Step 3
    return server.get_uri(database)


def stop_embedded_postgres(data_dir: str | Path) -> bool:
    """Stop the server running on ``data_dir`` (fast shutdown); False if none was running."""
    from pgserver import pg_ctl
    from pgserver.utils import PostmasterInfo

    path = _resolve(data_dir)
    info = PostmasterInfo.read_from_pgdata(path) if path.exists() else None
    if info is None or not info.is_running():
        return False
    user = "pgserver" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
    if user is not None:
        # pgserver opened the path's parents to the ``pgserver`` user when it started the server;
        # something may have closed one since (pytest makes /tmp/pytest-of-<user> 0700 again at
        # every start), and pg_ctl runs as that user: open them again, as pgserver itself does.
        from pgserver.utils import ensure_prefix_permissions

        ensure_prefix_permissions(path)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=path, user=user)
    return True


def dsn_from_env(default_data_dir: str | Path) -> str:
    """The DSN in ``$CUES_POSTGRES_DSN`` if set and non-empty, else the embedded server's.

    The DSN may hold a password: callers must not log it.
    """
    dsn = current().postgres_dsn
    if dsn:
        return dsn
    return embedded_postgres(default_data_dir)
