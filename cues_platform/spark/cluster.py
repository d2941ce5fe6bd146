"""A standalone Spark cluster on this machine: one Master and N Workers through pyspark's
``bin/spark-class``, bound to 127.0.0.1 on free random ports.

Under ``folder``: ``logs/`` (one log per daemon), ``work/worker-N`` (each worker's application
folders: executors' stdout/stderr) and ``local/worker-N`` (executors' scratch space). Each worker
offers ``cores`` cores and ``memory``; an application gets ``cores_per_app`` cores in all (the
master's ``spark.deploy.defaultCores``; default one per worker, spread over the workers), so
several drivers (a runner and a second runner, say) share the cluster instead of the first taking
every core and the next waiting for ever. :func:`start_cluster` returns once the Master reports
every worker ALIVE (its JSON at ``/json/``); :meth:`Cluster.stop` stops them by PID.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cues_platform.settings import child_environment
from cues_platform.spark.daemons import (
    POLL,
    SPARK_HOME,
    ClusterError,
    DaemonStartError,
    alive,
    daemon_marker,
    last_line,
    spawn,
    stop_pids,
    wait_for_line,
)
from cues_platform.spark.defaults import HOST, require_java

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
STARTED_ON = r"Successfully started service '{service}' on port (\d+)"


class PortInUseError(ClusterError):
    """The port asked for the Master is taken."""


class WorkerNotRegisteredError(DaemonStartError):
    """A worker started but the Master never listed it ALIVE."""


@dataclass(frozen=True)
class Daemon:
    role: str  # "master", "worker-1", ...
    pid: int
    port: int
    webui_port: int
    log: str


@dataclass(frozen=True)
class Cluster:
    folder: str
    master: Daemon
    workers: tuple[Daemon, ...] = field(default_factory=tuple)

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master.port}"

    @property
    def webui(self) -> str:
        return f"http://{HOST}:{self.master.webui_port}"

    def status(self, *, timeout: float = 5.0) -> dict[str, Any]:
        """The Master's JSON (``workers``, ``aliveworkers``, ``activeapps``, ...)."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=timeout) as response:  # noqa: S310
            return json.load(response)

    def stop(self, *, grace: float = 20.0, remove_work: bool = True) -> list[int]:
        """Stop the workers, then the master (SIGTERM, SIGKILL after ``grace`` s); remove the work
        and scratch folders (logs stay). The PIDs that were still running."""
        marker = daemon_marker(self.folder)
        stopped = stop_pids([w.pid for w in self.workers], marker=marker, grace=grace)
        stopped += stop_pids([self.master.pid], marker=marker, grace=grace)
        if remove_work:
            for sub in ("work", "local"):
                shutil.rmtree(Path(self.folder) / sub, ignore_errors=True)
        return stopped

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "webui": self.webui, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        return cls(folder=data["folder"], master=Daemon(**data["master"]),
                   workers=tuple(Daemon(**w) for w in data["workers"]))


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return True
    return False


def daemon_env(*, folder: Path, cores_per_app: int, local_dir: Path | None = None) -> dict[str, str]:
    conf = folder / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the user's leaks in
    conf.mkdir(parents=True, exist_ok=True)
    env = child_environment({
        "SPARK_HOME": str(SPARK_HOME), "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_DAEMON_JAVA_OPTS": daemon_marker(folder),
        # no REST submission server (fixed port 6066); a taken --port fails instead of moving on
        "SPARK_MASTER_OPTS": f"-Dspark.master.rest.enabled=false -Dspark.port.maxRetries=0 "
                             f"-Dspark.deploy.defaultCores={cores_per_app}"})
    if local_dir is not None:
        env["SPARK_LOCAL_DIRS"] = str(local_dir)
    return env


def start_cluster(*, folder: str | Path, workers: int = 2, cores: int = 2, memory: str = "2g",
                  cores_per_app: int | None = None, port: int = 0, timeout: float = 120.0) -> Cluster:
    """Start a Master and ``workers`` Workers on 127.0.0.1 and wait until the Master lists them
    ALIVE. ``port`` 0 picks a free port. On failure every daemon started here is stopped."""
    if workers < 1 or cores < 1:
        raise ClusterError(f"a cluster needs at least one worker with one core (got workers={workers}, "
                           f"cores={cores}): pass --workers and --cores of 1 or more")
    require_java()
    if port and port_taken(port):
        raise PortInUseError(f"port {port} on {HOST} is taken: pass another --port, or 0 for a free one",
                             port=port)
    root = Path(folder).resolve()
    deadline = time.monotonic() + timeout
    per_app = cores_per_app or workers
    started: list[Daemon] = []
    try:
        log = root / "logs" / "master.log"
        pid = spawn(argv=[MASTER, "--host", HOST, "--port", str(port), "--webui-port", "0"],
                    env=daemon_env(folder=root, cores_per_app=per_app), log=log)
        started.append(Daemon("master", pid, 0, 0, str(log)))

        def bind_failed(text: str) -> ClusterError:
            if "BindException" in text or "Address already in use" in text:
                return PortInUseError(f"the Spark master could not bind port {port} on {HOST} (taken): "
                                      f"pass another --port, or 0 for a free one (log: {log})", port=port)
            return DaemonStartError(f"the Spark master exited while starting: see its log {log} (last "
                                    f"line: {last_line(text)!r})", role="master", log=str(log))

        master_port = int(wait_for_line(pid=pid, log=log, pattern=STARTED_ON.format(service="sparkMaster"),
                                        role="master", deadline=deadline, on_exit=bind_failed).group(1))
        ui_port = int(wait_for_line(pid=pid, log=log, pattern=STARTED_ON.format(service="MasterUI"),
                                    role="master", deadline=deadline).group(1))
        master = Daemon("master", pid, master_port, ui_port, str(log))
        started[0] = master
        url = f"spark://{HOST}:{master_port}"
        for n in range(1, workers + 1):
            role = f"worker-{n}"
            wlog = root / "logs" / f"{role}.log"
            local = root / "local" / role
            local.mkdir(parents=True, exist_ok=True)
            wpid = spawn(argv=[WORKER, "--host", HOST, "--port", "0", "--webui-port", "0",
                               "--cores", str(cores), "--memory", memory,
                               "--work-dir", str(root / "work" / role), url],
                         env=daemon_env(folder=root, cores_per_app=per_app, local_dir=local), log=wlog)
            started.append(Daemon(role, wpid, 0, 0, str(wlog)))
        ready = []
        for daemon in started[1:]:
            wlog = Path(daemon.log)
            wport = int(wait_for_line(pid=daemon.pid, log=wlog, pattern=STARTED_ON.format(service="sparkWorker"),
                                      role=daemon.role, deadline=deadline).group(1))
            wui = int(wait_for_line(pid=daemon.pid, log=wlog, pattern=STARTED_ON.format(service="WorkerUI"),
                                    role=daemon.role, deadline=deadline).group(1))
            ready.append(Daemon(daemon.role, daemon.pid, wport, wui, daemon.log))
        cluster = Cluster(folder=str(root), master=master, workers=tuple(ready))
        started[1:] = ready
        wait_registered(cluster, deadline=deadline)
        return cluster
    except BaseException as exc:
        if started:
            try:
                Cluster(folder=str(root), master=started[0], workers=tuple(started[1:])).stop(grace=5.0)
            except ClusterError as stuck:  # the start's own error stays the one raised
                exc.add_note(f"and stopping what had started failed: {stuck}")
        raise


def wait_registered(cluster: Cluster, *, deadline: float) -> None:
    """Poll the Master's JSON until each of the cluster's workers is listed ALIVE."""
    wanted = {w.port: w for w in cluster.workers}
    alive_ports: set[int] = set()
    while True:
        try:
            workers = cluster.status()["workers"]
            alive_ports = {w["port"] for w in workers if w["state"] == "ALIVE" and w["host"] == HOST}
        except OSError:
            pass  # the UI is up (its port was logged) but may not answer yet
        missing = [w for port, w in wanted.items() if port not in alive_ports]
        if not missing:
            return
        dead = [w for w in missing if not alive(w.pid)]
        if dead:
            raise DaemonStartError(f"Spark {dead[0].role} exited before registering with the master: see "
                                   f"its log {dead[0].log}", role=dead[0].role, log=dead[0].log)
        if time.monotonic() > deadline:
            first = missing[0]
            raise WorkerNotRegisteredError(
                f"Spark {first.role} never registered with the master at {cluster.url}: see its log "
                f"{first.log} and the master's {cluster.master.log}; on a busy machine allow more time "
                "(--timeout)", role=first.role, log=first.log)
        time.sleep(POLL)
