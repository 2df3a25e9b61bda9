"""How much CPU other processes took while a bench phase ran, on a shared machine.

The load average cannot tell: a phase's own JVMs push it to 3-4 on 2 cores, and the next phase
starts under that decay. Instead /proc is sampled every second, and CPU time used by processes
outside this bench's process tree (children, grandchildren, their orphaned JVMs) is summed.
Processes that start and end between two samples are missed, so it is a lower bound. Linux only;
elsewhere it reports nothing. The same sampling sums the tree's own CPU (`own_seconds`): what the
measured run used while others had the rest, and with `by_part` that CPU split by what spent it
(`part_of`: the JVM's task threads, its driver threads, JIT, GC; the Python driver and workers).

`cpu_ticks` and `busy_share` say how busy the whole machine was over a phase (from /proc/stat):
the streaming phase reports it, since a latency measured on saturated cores is work per event,
not waiting.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(path: Path) -> tuple[str, int, int] | None:
    """(name, parent pid, CPU ticks so far) from a process's or thread's stat file; None once
    it is gone."""
    try:
        stat = path.read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return stat[stat.index("(") + 1:stat.rindex(")")], int(fields[1]), int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _snapshot() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks so far) for every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (stat := _stat(d / "stat")) is not None:
            out[int(d.name)] = stat[1:]
    return out


def _grown(snap: dict[int, tuple[int, int]], roots: set[int], among=None) -> set[int]:
    """`roots` and their descendants in `snap` (only those in `among`, if given), to a fixed
    point: a child's pid can be lower than its parent's."""
    found = set(roots)
    while True:
        new = {pid for pid, (ppid, _) in snap.items()
               if ppid in found and (among is None or pid in among)} - found
        if not new:
            return found
        found |= new


# A JVM thread's name (its first 15 characters in /proc) -> the part of the work it does.
_JVM_PARTS = (
    (re.compile(r"Executor task"), "tasks"),                    # Spark's tasks (local mode)
    (re.compile(r"Thread-\d"), "driver: calls from Python"),    # py4j: plans, writes, Delta commits
    (re.compile(r"stream execut"), "driver: streaming engine"),  # triggers, offsets, planning
    (re.compile(r"C\d CompilerThre"), "JIT"),
    (re.compile(r"GC Thread|VM Thread|G1 |ParGC"), "GC"),
)


def part_of(exe: str, thread: str, driver: bool) -> str:
    """The part of a run a thread's CPU goes to: `exe` its process's executable name, `thread`
    its name, `driver` whether its process is the run's own (not a child it started)."""
    if exe.startswith("java"):
        return next((part for pattern, part in _JVM_PARTS if pattern.match(thread)), "JVM other")
    if exe.startswith("python"):
        return "Python driver" if driver else "Python workers"
    return "other"


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (thread name, CPU ticks so far) for one process."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return {}
    return {int(t.name): (stat[0], stat[2]) for t in tasks if (stat := _stat(t / "stat")) is not None}


class OtherCpu:
    """with OtherCpu() as other: ...; then other.seconds and other.share(wall); with
    by_part=True also other.own_parts()."""

    def __init__(self, interval: float = 1.0, by_part: bool = False):
        self.interval, self.ours, self.seconds = interval, {os.getpid()}, None
        self.by_part = by_part
        self._thread_last: dict[tuple[int, int], int] = {}
        self._parts: dict[str, int] = {}
        # Processes of the tree that were there before the phase (the bench's own Spark session
        # and its workers), and their children: not the measured run's parts.
        self._before: set[int] = set()
        self._stop, self._thread = threading.Event(), None
        self._last: dict[int, int] = {}
        self._ticks = 0
        # The same for this process tree: what the measured run itself used (own_seconds()).
        self._own_last: dict[int, int] = {}
        self._own_ticks = 0

    def _sample(self, first: bool = False) -> None:
        snap = _snapshot()
        self.ours = _grown(snap, self.ours)
        if self.by_part:
            self._sample_parts(snap, first)
        for pid, (_, ticks) in snap.items():
            if pid in self.ours:
                # Processes of the tree that started during the phase count whole, like others'.
                self._own_ticks += 0 if first else ticks - self._own_last.get(pid, 0)
                self._own_last[pid] = ticks
                continue
            # A process first seen after the start ran only during the phase: all its ticks count.
            self._ticks += 0 if first else ticks - self._last.get(pid, 0)
            self._last[pid] = ticks
        for pid in set(self._last) - set(snap):
            del self._last[pid]
        for pid in set(self._own_last) - set(snap):
            del self._own_last[pid]

    def _sample_parts(self, snap: dict[int, tuple[int, int]], first: bool) -> None:
        me, seen = os.getpid(), set()
        self._before = _grown(snap, self.ours - {me} if first else self._before, among=self.ours)
        for pid in self.ours - self._before - {me}:   # the bench process itself only waits
            if pid not in snap:
                continue
            try:
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                continue
            for tid, (name, ticks) in _threads(pid).items():
                key = (pid, tid)
                seen.add(key)
                if not first:
                    part = part_of(exe, name, snap[pid][0] == me)
                    self._parts[part] = self._parts.get(part, 0) + ticks - self._thread_last.get(key, 0)
                self._thread_last[key] = ticks
        for key in set(self._thread_last) - seen:
            del self._thread_last[key]

    def own_parts(self) -> dict[str, float]:
        """by_part: this process tree's CPU seconds by part (part_of), largest first, as of the
        last sample; a thread that ended between two samples loses its last second."""
        return {k: round(v / TICK, 1) for k, v in sorted(self._parts.items(), key=lambda kv: -kv[1])}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        if Path("/proc/self/stat").exists():
            self._sample(first=True)
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
            self.seconds = round(self._ticks / TICK, 1)

    def own_seconds(self) -> float:
        """This process tree's CPU seconds since the start, as of the last sample (a child that
        ended between two samples loses its last second)."""
        return self._own_ticks / TICK

    def seconds_so_far(self) -> float:
        """Other processes' CPU seconds since the start, as of the last one-second sample."""
        return self._ticks / TICK

    def share(self, wall: float) -> float | None:
        """Other processes' CPU as a share of the machine's capacity over `wall` seconds."""
        return None if self.seconds is None or wall <= 0 else round(self.seconds / (wall * os.cpu_count()), 3)


def cpu_share(seconds: float | None, wall: float) -> float | None:
    """CPU seconds as a share of the machine's cores over `wall` seconds."""
    return None if seconds is None or wall <= 0 else round(seconds / (wall * (os.cpu_count() or 1)), 3)


def cpu_ticks(stat: str | None = None) -> tuple[int, int] | None:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat's `cpu` line (or the
    given text); None where there is no /proc/stat. Idle and iowait are the not-busy ones."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return None
    fields = [int(x) for x in stat.split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest times are already counted in user and nice
    total = sum(fields[:8])
    return total - idle, total


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU capacity in use between two cpu_ticks readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def feed_measured(feeder) -> tuple[float | None, float | None, float | None]:
    """Run `feeder` (a Feeder not yet started) to its end; returns the cores' busy share over the
    feed, and the shares of them other processes and this run took (the machine may be shared)."""
    with OtherCpu() as cpu:
        feeder.start()
        ticks = cpu_ticks()
        feeder.join()
        busy = busy_share(ticks, cpu_ticks())
        fed = feeder.finished_at - feeder.started_at
        return busy, cpu_share(cpu.seconds_so_far(), fed), cpu_share(cpu.own_seconds(), fed)
