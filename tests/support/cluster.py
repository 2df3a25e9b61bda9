"""A throwaway Spark standalone cluster (one master, N workers) on 127.0.0.1, for tests.

The daemons are the ones pyspark ships (`pyspark/bin/spark-class` with
org.apache.spark.deploy.master.Master / org.apache.spark.deploy.worker.Worker), on free ports,
with their work dirs and logs under one folder. Each daemon runs in its own process group, and
the executors a worker launches stay in that group, so stop() can end every JVM it caused.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from common.errors import LakehouseError
from tools.processes import free_port
from tools.processes import process_table

HOST = "127.0.0.1"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never send 127.0.0.1 via a proxy


class ClusterError(LakehouseError, RuntimeError):
    pass


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


class StandaloneCluster:
    def __init__(self, base_dir: Path, workers: int = 2, worker_cores: int = 1,
                 worker_memory: str = "1536m", daemon_memory: str = "512m", java_options: str = ""):
        self.base_dir = Path(base_dir)
        self.java_options = java_options  # for every daemon and executor JVM (JAVA_TOOL_OPTIONS)
        self.workers, self.worker_cores = workers, worker_cores
        self.worker_memory, self.daemon_memory = worker_memory, daemon_memory
        self.port = free_port()
        self.webui_port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}"

    def log(self, name: str) -> Path:
        return self.base_dir / "logs" / f"{name}.log"

    def env(self) -> dict[str, str]:
        conf_dir = self.base_dir / "conf"  # empty: no spark-env.sh / spark-defaults.conf leaks in
        conf_dir.mkdir(parents=True, exist_ok=True)
        e = dict(os.environ)
        for var in ("SPARK_MASTER", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR"):
            e.pop(var, None)
        e.update(SPARK_LOCAL_IP=HOST, SPARK_CONF_DIR=str(conf_dir),
                 SPARK_DAEMON_MEMORY=self.daemon_memory,
                 SPARK_WORKER_CORES=str(self.worker_cores), SPARK_WORKER_MEMORY=self.worker_memory,
                 SPARK_LOG_DIR=str(self.base_dir / "logs"))
        if self.java_options:
            # Executors inherit the worker's environment, so this reaches them too.
            e["JAVA_TOOL_OPTIONS"] = f"{e.get('JAVA_TOOL_OPTIONS', '')} {self.java_options}".strip()
        return e

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = self.log(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            # spark-class execs the JVM, so the pid is the daemon itself; a new session makes it
            # (and the executors it forks) one process group we can signal as a whole.
            self.procs[name] = subprocess.Popen([str(spark_class()), *args], env=env, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)

    def start(self, timeout: float = 120.0) -> "StandaloneCluster":
        try:
            env = self.env()
            self._launch("master", ["org.apache.spark.deploy.master.Master", "--host", HOST,
                                    "--port", str(self.port), "--webui-port", str(self.webui_port)], env)
            self._wait(lambda s: s is not None, timeout, "the master web UI to answer")
            for i in range(1, self.workers + 1):
                work_dir = self.base_dir / f"worker-{i}"
                work_dir.mkdir(parents=True, exist_ok=True)
                self._launch(f"worker-{i}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", HOST,
                    "--port", str(free_port()), "--webui-port", str(free_port()),
                    "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                    "--work-dir", str(work_dir), self.master_url], dict(env, SPARK_WORKER_DIR=str(work_dir)))
            self._wait(lambda s: s is not None and s.get("aliveworkers") == self.workers, timeout,
                       f"{self.workers} workers to register")
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict | None:
        """The master's /json/ view (workers, cores, apps), or None while it does not answer."""
        try:
            with _NO_PROXY.open(f"{self.webui_url}/json/", timeout=2) as r:
                return json.load(r)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _wait(self, ready, timeout: float, what: str) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited with code {proc.returncode} while waiting for "
                                       f"{what}:\n{self.tail(name)}")
            s = self.state()
            if ready(s):
                return s
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:g}s waiting for {what}; master says "
                                   f"{s!r}\n{self.tail('master')}")
            time.sleep(0.5)

    def tail(self, name: str, chars: int = 3000) -> str:
        try:
            return self.log(name).read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def alive_pids(self) -> list[int]:
        """Every process still in one of the daemons' process groups (daemons and executors)."""
        groups = {p.pid for p in self.procs.values()}
        return [pid for pid, _, pgrp, zombie in process_table() if pgrp in groups and not zombie]

    def _signal_groups(self, sig: int) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every daemon's group (workers kill their executors), then SIGKILL what is left."""
        if not self.procs:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            self._signal_groups(sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                for proc in self.procs.values():
                    proc.poll()  # reap our children
                if not self.alive_pids():
                    break
                time.sleep(0.2)
            if not self.alive_pids():
                break
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
