"""Process helpers for the tools and tests that launch processes: job trees (chaos, cluster,
bench) and the local servers (Kafka broker, S3 server).

Jobs run in their own sessions (run-all) and fork a JVM, so signalling one pid is not enough:
these find and end every descendant, and check that nothing was left behind. psutil, not /proc,
so they work wherever the project does.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

from common.spark import C1_ONLY


def with_jvm_options(env: dict[str, str], options: str = C1_ONLY) -> dict[str, str]:
    """env with options appended to JAVA_TOOL_OPTIONS, which every JVM the process starts reads:
    for JVMs the driver's conf (spark.jit) does not reach, such as a standalone cluster's
    daemons and the executors they fork. Default: C1 only, for short runs on a small machine."""
    return dict(env, JAVA_TOOL_OPTIONS=f"{env.get('JAVA_TOOL_OPTIONS', '')} {options}".strip())


def process_table():
    """(pid, ppid, pgrp, zombie) of every process, from psutil (Linux, macOS, BSD alike)."""
    for p in psutil.process_iter(["ppid", "status"]):
        try:
            pgrp = os.getpgid(p.pid)
        except (ProcessLookupError, PermissionError):
            continue
        yield p.pid, p.info["ppid"], pgrp, p.info["status"] == psutil.STATUS_ZOMBIE


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (children, grandchildren...), whatever their session."""
    children: dict[int, list[int]] = {}
    for p, ppid, _, zombie in process_table():
        if not zombie:
            children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process and all its descendants (run-all puts each job in its own session)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def processes_using(path: Path) -> list[str]:
    """Live processes whose command line or working directory lies under path (leak check)."""
    needle = str(Path(path).resolve())
    found = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        if needle in cmd or (p.info["cwd"] or "").startswith(needle):
            found.append(f"{p.pid}: {cmd[:200]}")
    return found


def command_line(pid: int) -> str:
    """pid's command line, or "" once it is gone."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def rss(pid: int) -> int | None:
    """pid's resident memory in bytes, None once it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def live_pid(pid_file: Path) -> int | None:
    """The pid a local server (Kafka broker, S3 server) recorded, if that process still runs."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None


def terminate(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM (a clean shutdown), SIGKILL after timeout; reaps it when it is our child."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # reap it if it is our child (tests), so it doesn't linger as a zombie
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
