"""One Spark session per process, reused across steps.

Default ``local[*]`` bound to 127.0.0.1 with the web UI off; a ``spark://``/``yarn``/``k8s://``
master for a cluster; an ``sc://`` URL for Spark Connect. Spark needs Java 17+ on the machine:
when it is missing, :func:`get_spark` says so in one line instead of a JVM stack trace.
Python workers run the driver's interpreter unless the user chose one (:func:`use_this_python`).

The driver's JVM runs in a process group (a session) of its own (:func:`launch_driver_jvm`): a
SIGTERM or Ctrl-C to the group of the process that uses Spark (a shell's job, ``kill -TERM -PGID``,
a supervisor) reaches the Python process only, which stops at a step boundary and then ends Spark;
the JVM exits when its gateway's stdin closes, i.e. when that process ends, however it ends.
Its stderr reaches ours through :func:`forward_jvm_stderr`, without the JVM's own start-up
warning about incubator modules (one line per run in `dagster dev` otherwise).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cues_platform.errors import ConfigurationError
from cues_platform.settings import current, export
from cues_platform.spark.client import close_at_exit, require_server
from cues_platform.spark.defaults import (
    JAVA_OPTIONS_KEY,
    LOCAL_DEFAULTS,
    LOCAL_FILES_DEFAULTS,
    LOG_CONFIG,
    MIN_JAVA,
    SESSION_DEFAULTS,
    java_major_version,
    require_java,
)


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[*]"
    app_name: str = "cues_platform"
    conf: Mapping[str, str] = field(default_factory=dict)


def driver_java_options(settings: SparkSettings) -> str:
    """The driver JVM's options: our quiet log configuration first, then the user's (a
    ``-Dlog4j2.configurationFile`` of theirs comes later and wins)."""
    ours = f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    theirs = settings.conf.get(JAVA_OPTIONS_KEY, "")
    return f"{ours} {theirs}".strip()


def use_this_python(settings: SparkSettings) -> None:
    """Make Spark's Python workers (and the driver) run this interpreter, which has pyarrow and the
    user's packages, instead of whatever ``python3`` is first on PATH. A value the user set
    (``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``, or ``spark.pyspark.python`` in the settings) is
    kept. Only for local masters and standalone masters on this machine (``spark://127.0.0.1:…``,
    ``spark://localhost:…``, as ``cues spark cluster up`` starts): their executors run here too. On a
    remote cluster the executors' interpreter is the cluster's business."""
    export("PYSPARK_DRIVER_PYTHON", sys.executable, keep_existing=True)
    local = settings.master.startswith(("local", "spark://127.0.0.1:", "spark://localhost:"))
    if local and "spark.pyspark.python" not in settings.conf:
        export("PYSPARK_PYTHON", sys.executable, keep_existing=True)


class SparkMasterUnreachableError(ConfigurationError):
    """A ``spark://`` master that accepts no connection (else the driver retries for a minute)."""


def require_master(master: str, *, timeout: float = 5.0) -> None:
    """A standalone master (``spark://host:port``, or several comma-separated) must accept a TCP
    connection before the driver's JVM starts: otherwise Spark retries for about a minute and then
    leaves a stopped context behind a stack trace."""
    hosts = master.removeprefix("spark://").split(",")
    failures = []
    for hostport in hosts:
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            failures.append(f"{hostport}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc))
    raise SparkMasterUnreachableError(
        f"the Spark master {master} is unreachable ({'; '.join(failures)}): start it "
        "(`cues spark cluster up` for one on this machine, `cues spark cluster status` says where it "
        "runs) or fix CUES_SPARK_MASTER", master=master)


# Spark's launcher (spark-launcher's JavaModuleOptions, not configurable) starts every driver JVM
# with --add-modules=jdk.incubator.vector, and the JVM then prints this line to stderr at boot:
# no JVM option turns it off (-XX:-PrintWarnings, --limit-modules do not), so it is left out where
# the JVM's stderr comes through us. Only lines that start with it are left out.
JVM_NOISE = (b"WARNING: Using incubator modules:",)


def forward_jvm_stderr(stream: Any, *, to_fd: int | None = None,
                       drop: tuple[bytes, ...] = JVM_NOISE) -> threading.Thread:
    """Copy a JVM's stderr (a binary pipe) to ``to_fd`` line by line, except the lines that start
    with one of ``drop``; returns the (daemon) thread that does it, which ends at end of file.

    ``to_fd`` defaults to a duplicate of this process's stderr taken now: the JVM writes where it
    would have written had it inherited our stderr at launch. The pipe is drained to its end even
    when ``to_fd`` can no longer be written (closed terminal): a JVM never blocks on a full pipe."""
    target = os.dup(2) if to_fd is None else to_fd

    def pump() -> None:
        writable = True
        with stream:
            for line in iter(stream.readline, b""):
                if not writable or line.startswith(drop):
                    continue
                view = memoryview(line)
                try:
                    while view:
                        view = view[os.write(target, view):]
                except OSError:  # EPIPE/EBADF: nobody reads our stderr any more; keep draining
                    writable = False
        if to_fd is None:
            os.close(target)

    thread = threading.Thread(target=pump, name="spark-jvm-stderr", daemon=True)
    thread.start()
    return thread


def _classic(options: Mapping[str, str]) -> bool:
    """Whether ``SparkSession.builder.getOrCreate()`` takes the classic path (a py4j gateway to a
    driver JVM this process starts) with these options, rather than a Spark Connect one."""
    from pyspark.util import default_api_mode

    s = current()  # pyspark's own variables, read as pyspark reads them (set, even empty: Connect)
    if any(v is not None for v in (s.spark_connect_mode_enabled, s.spark_remote,
                                   s.spark_local_remote)):
        return False
    mode = options.get("spark.api.mode", s.spark_api_mode or "").lower()
    if mode not in ("classic", "connect"):
        mode = default_api_mode()
    return mode == "classic" and "spark.remote" not in options


def launch_driver_jvm(*, options: Mapping[str, str]) -> bool:
    """Start this process's Spark driver JVM in a session (so a process group) of its own, with the
    SparkContext of ``options``; True if it started one (False: a JVM exists, or Connect).

    Why: a stop of the process group (``kill -TERM -PGID``, a shell's job control, a supervisor)
    also reached the JVM, whose shutdown hooks then stopped the SparkContext under the job in flight
    and printed Java stack traces to the stderr it shares with us (``ERROR TaskSchedulerImpl:
    Exception in statusUpdate`` / ``RejectedExecutionException``...), while the Python side stopped
    gracefully. Out of the group, the JVM hears no group signal: the Python process finishes or
    abandons its step as it decides, and when it ends (exit, exception, SIGKILL) the JVM reads end
    of file on the gateway's stdin pipe and exits (PythonGatewayServer), ending Spark cleanly.

    Why not ``SIGTERM`` ignored in the JVM: a child inherits an ignored signal only if it is ignored
    in this process when the child is forked (pyspark's Popen sets its own ``preexec_fn``), and a
    SIGTERM that came while it was ignored here (Spark takes seconds to start) would be lost for
    good. ``-Xrs`` instead makes SIGTERM kill the JVM at once, without the shutdown hooks that
    delete Spark's temporary folders, and SIGQUIT (``jstack``) kill it too.

    pyspark's own ``launch_gateway`` starts the JVM, with ``start_new_session`` among the Popen
    arguments it documents for that use; the context then takes the gateway as
    ``SparkContext(gateway=...)``, which the builder's ``getOrCreate`` finds and reuses.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    # SparkContext._gateway: pyspark keeps one gateway per process there, and reuses it for every
    # later context (after spark.stop() too); a second JVM would never be used.
    if SparkContext._gateway is not None or not _classic(options):
        return False
    conf = SparkConf().setAll(list(options.items()))
    gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True, "stderr": subprocess.PIPE})
    forward_jvm_stderr(gateway.proc.stderr)
    SparkContext(conf=conf, gateway=gateway)
    return True


def get_spark(settings: SparkSettings | None = None) -> Any:
    """Return the process's Spark session, creating it on first use."""
    from pyspark.sql import SparkSession

    s = settings or SparkSettings(master=current().spark_master)
    use_this_python(s)
    connect = s.master.startswith("sc://")
    if connect:
        require_server(s.master)
        options = {"spark.remote": s.master, **SESSION_DEFAULTS}  # the server's static settings stay its own
    else:
        if s.master.startswith("spark://"):
            require_master(s.master)
        require_java()
        export("SPARK_LOCAL_IP", "127.0.0.1", keep_existing=True)
        options = {"spark.master": s.master, **LOCAL_DEFAULTS}
        if s.master.startswith("local"):
            options.update(LOCAL_FILES_DEFAULTS)
    options["spark.app.name"] = s.app_name
    options.update(s.conf)
    if not connect:
        options[JAVA_OPTIONS_KEY] = driver_java_options(s)
        launch_driver_jvm(options=options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if connect:
        close_at_exit(session)
    else:
        session.sparkContext.setLogLevel(current().spark_log_level)
    return session


__all__ = ["JAVA_OPTIONS_KEY", "JVM_NOISE", "LOCAL_DEFAULTS", "LOCAL_FILES_DEFAULTS", "LOG_CONFIG",
           "MIN_JAVA", "SparkMasterUnreachableError", "SparkSettings", "driver_java_options",
           "forward_jvm_stderr", "get_spark",
           "java_major_version", "launch_driver_jvm", "require_java", "require_master",
           "use_this_python"]
