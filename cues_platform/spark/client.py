"""The Spark Connect client side: what a process attaching to an ``sc://`` server needs (no
server code, no pyspark import at module level). The server lives in ``connect.py``."""

from __future__ import annotations

import atexit
import socket
from typing import Any
from urllib.parse import urlparse

from cues_platform.errors import CuesError
from cues_platform.spark.defaults import HOST

DEFAULT_PORT = 15002  # Spark Connect's own default


class ConnectServerError(CuesError):
    """A Spark Connect server could not be started, found or stopped."""


class ConnectServerUnreachableError(ConnectServerError):
    """An ``sc://`` URL whose server accepts no connection."""

    retryable = True


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``), False for a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_server(url: str, *, timeout: float = 5.0) -> None:
    """The server of ``url`` must accept a TCP connection before a session is built: Spark
    Connect's client retries an unreachable server for at least 10 minutes before it fails."""
    parsed = urlparse(url)
    host, port = parsed.hostname, parsed.port or DEFAULT_PORT
    try:
        with socket.create_connection((host or HOST, port), timeout=timeout):
            return
    except OSError as exc:
        raise ConnectServerUnreachableError(
            f"the Spark Connect server {url} is unreachable ({exc.strerror or exc}): start it "
            "(`cues spark connect up` for one on this machine, `cues spark connect status` says "
            "where it runs) or fix CUES_SPARK_MASTER", url=url) from exc


def close_at_exit(session: Any) -> None:
    """Close the session's channel when the process exits, before pyspark's own exit hook runs
    (``atexit`` runs last-registered first): that hook sends a clean-up call which, with the
    server gone, retries for minutes and holds the process's exit. The server ends the session
    when it expires there."""
    client = session.client
    if id(client) not in _CLOSING:  # get_spark returns the same session again: register once
        _CLOSING.add(id(client))
        atexit.register(client.close)


_CLOSING: set[int] = set()

__all__ = ["DEFAULT_PORT", "ConnectServerError", "ConnectServerUnreachableError", "close_at_exit",
           "is_connect", "require_server"]
