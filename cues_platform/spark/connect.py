"""Spark Connect: one warm Spark that the platform's processes attach to (``sc://host:port``).

Every ``cues run`` or Dagster run process with ``CUES_SPARK_MASTER=local[*]`` starts a JVM of its
own, seconds before its first step. A Spark Connect server (:func:`start_connect_server`,
``cues spark connect up``) is started once; a process then attaches over gRPC in well under a
second. Processors run unchanged: the step path calls no ``sparkContext`` and no RDD API, and
the processing tests pass against a server (``tests/spark/test_connect.py``).

The server is pyspark's own ``SparkConnectServer`` (the class ``sbin/start-connect-server.sh``
submits), run in the foreground of a session of its own through ``bin/spark-class``:

- bound to 127.0.0.1 on a free port (or ``port``), Spark's web UI off;
- its Spark is ``master`` (``local[*]`` by default, or a cluster such as
  ``cues spark cluster up`` starts), with the platform's session defaults
  (``defaults.LOCAL_DEFAULTS``: UTC, Parquet timestamps in microseconds, no ``_SUCCESS`` files);
- its Python workers run this interpreter with ``python_path`` on ``PYTHONPATH``: a processor's
  function is pickled by reference to its module, so the workers must import the user's code
  (on a remote server, ship it with ``spark.addArtifacts(..., pyfile=True)``).

The client side (``require_server``, ``close_at_exit``, ``is_connect``) is ``client.py``, the
defaults both share ``defaults.py``; they are re-exported here for callers of this module.

A server is stopped by PID (SIGTERM, then SIGKILL after a grace period), only while its command
line still names its folder (a stale state file never signals a process that reused the PID).
Sessions attached to a server that stopped fail their next call with Spark Connect's own
transport error, which a step classifies as a platform failure (nothing delivered, the step is
planned again by the next start).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cues_platform.errors import CuesError
from cues_platform.settings import child_environment
from cues_platform.spark.client import (
    DEFAULT_PORT,
    ConnectServerError,
    ConnectServerUnreachableError,
    close_at_exit,
    is_connect,
    require_server,
)
from cues_platform.spark.daemons import (
    POLL,
    SPARK_HOME,
    ClusterError,
    alive,
    daemon_marker,
    is_ours,
    last_line,
    spawn,
    stop_pids,
)
from cues_platform.spark.defaults import (
    HOST,
    LOCAL_DEFAULTS,
    LOCAL_FILES_DEFAULTS,
    LOG_CONFIG,
    SESSION_DEFAULTS,
    require_java,
)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass(frozen=True)
class ConnectServer:
    folder: str
    pid: int
    port: int
    master: str
    log: str

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    def running(self) -> bool:
        return is_ours(self.pid, marker=daemon_marker(self.folder))

    def stop(self, *, grace: float = 20.0) -> bool:
        """Stop the server (SIGTERM, SIGKILL after ``grace`` s). True if it was still running."""
        return bool(stop_pids([self.pid], marker=daemon_marker(self.folder), grace=grace))

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConnectServer:
        return cls(folder=data["folder"], pid=int(data["pid"]), port=int(data["port"]),
                   master=data["master"], log=data["log"])


def server_argv(*, folder: Path, port: int, master: str, conf: dict[str, str]) -> list[str]:
    """``spark-class`` arguments of the server (spark-submit of ``SparkConnectServer``)."""
    settings = dict(LOCAL_DEFAULTS)
    if master.startswith("local"):
        settings.update(LOCAL_FILES_DEFAULTS)
    settings.update({"spark.connect.grpc.binding.address": HOST,
                     "spark.connect.grpc.binding.port": str(port)})
    settings.update(conf)
    java = f"{daemon_marker(folder)} -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    argv = ["org.apache.spark.deploy.SparkSubmit", "--class", SERVER_CLASS,
            "--name", "cues Spark Connect server", "--master", master,
            "--driver-java-options", java]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def start_connect_server(*, folder: str | Path, port: int = 0, master: str = "local[*]",
                         python_path: str | Path | None = None, conf: dict[str, str] | None = None,
                         timeout: float = 180.0) -> ConnectServer:
    """Start a Spark Connect server and wait until it accepts sessions (its log says so).

    ``port`` 0 picks a free one. ``python_path``: a folder the server's Python workers import the
    user's code from (default: the current directory). On failure the server is stopped."""
    require_java()
    root = Path(folder).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = root / "connect-server.log"
    log.write_text("")  # this start's log only: the readiness line of an earlier start must not count
    code = str(Path(python_path or Path.cwd()).resolve())
    env = child_environment()
    env.update({"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": HOST,
                "SPARK_CONF_DIR": str(_empty_conf(root)), "PYSPARK_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join(p for p in (code, env.get("PYTHONPATH", "")) if p)})
    extra = dict(conf or {})
    if not master.startswith("local"):
        extra.setdefault("spark.executorEnv.PYTHONPATH", code)
        extra.setdefault("spark.pyspark.python", sys.executable)
    pid = spawn(argv=server_argv(folder=root, port=port, master=master, conf=extra), env=env, log=log)
    server = ConnectServer(folder=str(root), pid=pid, port=port, master=master, log=str(log))

    def exited(text: str) -> ConnectServerError:
        taken = "BindException" in text or "Address already in use" in text
        what = (f"port {port} on {HOST} is taken: pass another --port, or 0 for a free one" if taken
                else f"see its log {log} (last line: {last_line(text)!r}) and fix what it says")
        return ConnectServerError(f"the Spark Connect server exited while starting: {what}",
                                  port=port, log=str(log))

    try:
        wait_listening(server, deadline=time.monotonic() + timeout, on_exit=exited)
    except BaseException as exc:
        try:
            server.stop(grace=5.0)
        except ClusterError as stuck:  # the start's own error stays the one raised
            exc.add_note(f"and stopping the server failed: {stuck}")
        raise
    return server


def wait_listening(server: ConnectServer, *, deadline: float,
                   on_exit: Callable[[str], CuesError]) -> None:
    """Poll until the server's gRPC port accepts a connection (its log is errors only, so it has
    no "started" line to wait for); a server that exits or a deadline that passes is an error."""
    log = Path(server.log)
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            if probe.connect_ex((HOST, server.port)) == 0:
                return
        if not alive(server.pid):
            raise on_exit(log.read_text(errors="replace") if log.exists() else "")
        if time.monotonic() > deadline:
            raise ConnectServerError(
                f"the Spark Connect server did not listen on {HOST}:{server.port} in time: see its "
                f"log {log}; on a busy machine allow more time (--timeout)", port=server.port,
                log=str(log), retryable=True)
        time.sleep(POLL)


def _empty_conf(root: Path) -> Path:
    conf = root / "conf"  # no spark-defaults.conf of the user's leaks into the server
    conf.mkdir(parents=True, exist_ok=True)
    return conf


__all__ = ["DEFAULT_PORT", "HOST", "SESSION_DEFAULTS", "ConnectServer", "ConnectServerError",
           "ConnectServerUnreachableError", "close_at_exit", "is_connect", "require_server",
           "start_connect_server"]
