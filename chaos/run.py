"""The chaos session: three job processes on processing-time triggers, data arriving in waves,
kill -9 of a whole job process tree (Python driver and its JVM) on a seeded schedule, an
immediate restart each time, then a drain (available-now bronze, silver, gold) and the audit.

The schedule is drawn up front from the seed and printed, so a failing run can be repeated: the
same seed gives the same kill order, delays and data (when each kill lands inside a batch still
depends on the machine's speed).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

from common.log import message_of, parseable_env
from tools.processes import descendants, kill_tree
from common.storage import is_delta_table

LAYERS = ("bronze", "silver", "gold")
NEEDS = {"silver": ("bronze", "events"), "gold": ("silver", "camera_events")}
# What is killed: the one pipeline process (every layer's queries in one application), or, in
# the split mode, each layer's own process, as teams that deploy layers apart run them.
# The mixed mode does both in one session: the pipeline process first, then, once its kills are
# done, each layer in its own process on the same checkpoints (a team moving from one deployment
# to the other), with one drain and one audit for both.
UNITS = {"app": ("pipeline",), "split": LAYERS, "mixed": ("pipeline", *LAYERS)}
# A failed drain prints this many of its last log lines: a CI run keeps only what tests print.
DRAIN_TAIL_LINES = 40
COMMAND = {"pipeline": ["pipeline"], **{layer: ["pipeline", "--layer", layer] for layer in LAYERS}}


@dataclass
class Kill:
    layer: str
    after_s: float          # seconds after the moment `since` names
    since: str              # "start": the process started (start-up, recovery); "query": its query
                            # began (mostly inside the first batch); "batch": it completed `batches`
    batches: int = 0
    at_s: float = 0.0       # when it happened, since the session began
    pid: int = 0
    tree: int = 0           # processes killed (driver + JVM + anything they forked)
    job_state: str = ""     # what the job had printed last, for the report

    def as_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass
class Settings:
    kills: int = 10
    seed: int = 1
    events_per_wave: int = 100
    files_per_wave: int = 2
    feed_every_s: float = 8.0
    wave_span_s: float = 20 * 60          # event time per wave: watermarks keep moving
    # Where kills land: a share during start-up (JVM, table creation, checkpoint recovery), a
    # share soon after the query began (its first batch), the rest once the job has committed
    # one or two batches since it started (so later batches die too, whatever the machine's speed).
    startup_share: float = 0.2
    query_share: float = 0.3
    startup_after_s: tuple = (1.0, 15.0)
    query_after_s: tuple = (0.0, 15.0)
    batch_after_s: tuple = (0.0, 8.0)
    interval: str = "3 seconds"           # every layer's processing-time trigger
    mode: str = "app"                     # app: kill the one pipeline process; split: single layers
    driver_memory: str = "1g"
    drain_timeout_s: float = 600.0
    max_kill_phase_s: float = 1200.0      # give up (a job that never gets going) after this long


def schedule(s: Settings) -> dict[str, list[Kill]]:
    """Each layer's kills, in order: the three layers share the kills about equally and each is
    killed on its own timeline (so the jobs die independently, also at the same time)."""
    rng = Random(s.seed)
    units = UNITS[s.mode]
    if s.mode == "mixed":
        # The pipeline's kills come first (one at least), then every layer's, each layer at least once.
        split = max(len(LAYERS), s.kills - max(1, s.kills // 2))
        layers = [LAYERS[i % len(LAYERS)] for i in range(split)]
        rng.shuffle(layers)
        layers = ["pipeline"] * max(1, s.kills - split) + layers
    else:
        layers = [units[i % len(units)] for i in range(s.kills)]
        rng.shuffle(layers)
    plan: dict[str, list[Kill]] = {layer: [] for layer in units}
    for layer in layers:
        r = rng.random()
        since = "start" if r < s.startup_share else "query" if r < s.startup_share + s.query_share else "batch"
        window = {"start": s.startup_after_s, "query": s.query_after_s, "batch": s.batch_after_s}[since]
        batches = rng.randint(1, 2) if since == "batch" else 0
        plan[layer].append(Kill(layer, round(rng.uniform(*window), 1), since, batches))
    return plan


def _moment(kill: Kill) -> str:
    return {"start": "start", "query": "query start"}.get(kill.since, f"batch line {kill.batches}")


def job_env(root, s: Settings, base: dict | None = None) -> dict:
    # Plain log lines at INFO or finer: Job.poll reads them.
    env = parseable_env(base if base is not None else os.environ)
    for var in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE"):
        env.pop(var, None)
    env.update(LAKEHOUSE_ROOT=str(root), TRIGGER="processing-time", TRIGGER_INTERVAL=s.interval,
               SPARK_LOCAL_IP="127.0.0.1",
               LAKEHOUSE__SPARK__DRIVER_MEMORY=s.driver_memory,
               # A chaos life is seconds to minutes: C1 warms up fastest, whatever the trigger.
               LAKEHOUSE__SPARK__JIT="c1",
               # Gold backfills the late events it keeps by itself, soon: kills land in backfills
               # too, and the audit proves what they wrote.
               LAKEHOUSE__GOLD__BACKFILL="auto", LAKEHOUSE__GOLD__BACKFILL_DELAY="5 seconds")
    return env


@dataclass
class Job:
    layer: str
    proc: subprocess.Popen
    log: Path
    started: float
    query_started: float | None = None
    batch_seen: dict = field(default_factory=dict)   # batches printed -> when first seen

    def poll(self) -> None:
        """Note when the job printed that its query runs ("<layer>: <source> -> <sink>") and when
        each of its batch lines ("<query>  batch <n>  ...") appeared, after their timestamps."""
        try:
            lines = [message_of(l) for l in self.log.read_text(errors="replace").splitlines()]
        except FileNotFoundError:
            return
        # "<layer>: <source> -> <sink>": the pipeline process prints one per layer it starts.
        names = LAYERS if self.layer == "pipeline" else (self.layer,)
        if self.query_started is None and any(l.split(":")[0] in names and " -> " in l for l in lines):
            self.query_started = time.monotonic()
        n = sum(1 for l in lines if re.match(r"^\S+\s+batch \d+ ", l))
        for i in range(1, n + 1):
            self.batch_seen.setdefault(i, time.monotonic())

    def reference(self, kill) -> float | None:
        """The moment kill.after_s counts from, once it has happened."""
        if kill.since == "start":
            return self.started
        self.poll()
        return self.query_started if kill.since == "query" else self.batch_seen.get(kill.batches)

    def last_line(self) -> str:
        try:
            # Spark's warnings say little about where the job was; its own lines do.
            lines = [message_of(l) for l in self.log.read_text(errors="replace").splitlines()]
            lines = [l for l in lines
                     if l.strip() and not l.startswith(("\t", " ")) and " WARN " not in l
                     and not l.startswith(("WARNING", "Picked up", "Using Spark", "Setting default",
                                           "To adjust"))]
        except FileNotFoundError:
            return ""
        return lines[-1][:160] if lines else "(start-up, nothing of its own printed yet)"


@dataclass
class Outcome:
    kills: list[Kill] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    drain_code: int | None = None
    drain_log: str = ""
    seconds: float = 0.0


class Session:
    def __init__(self, cfg, root, s: Settings, feeder, logs: Path, say=print):
        self.cfg, self.root, self.s, self.feeder, self.say = cfg, root, s, feeder, say
        self.env = job_env(root, s)
        self.logs = logs
        self.logs.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, Job] = {}
        # What runs now: in the mixed mode the pipeline process until its last kill, then the layers.
        self.units = ("pipeline",) if s.mode == "mixed" else UNITS[s.mode]
        self.runs = dict.fromkeys(UNITS[s.mode], 0)
        self.outcome = Outcome()
        self.t0 = time.monotonic()
        self.next_feed = self.t0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _spawn(self, layer: str) -> None:
        self.runs[layer] += 1
        log = self.logs / f"{layer}-{self.runs[layer]:02d}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", *COMMAND[layer]], env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.jobs[layer] = Job(layer, proc, log, time.monotonic())

    def _ready(self, layer: str) -> bool:
        need = NEEDS.get(layer)
        return need is None or is_delta_table(self.cfg.table_path(*need))

    def _tick(self) -> None:
        """Feed a wave when due; start layers whose input exists; restart any job that died."""
        if time.monotonic() >= self.next_feed and self.feeding:
            n = self.feeder.wave()
            self.next_feed += self.s.feed_every_s
            self.say(f"[{self.now():6.1f}s] wave {self.feeder.expected.waves}: {n} records")
        for layer in self.units:
            job = self.jobs.get(layer)
            if job is None:
                if self._ready(layer):
                    self._spawn(layer)
                continue
            if job.proc.poll() is not None:
                msg = (f"{layer} run {self.runs[layer]} exited on its own with code {job.proc.returncode}: "
                       f"{job.last_line()} (log {job.log})")
                self.say(f"[{self.now():6.1f}s] UNEXPECTED: {msg}")
                self.outcome.unexpected_exits.append(msg)
                self._spawn(layer)

    def _due(self, kill: Kill) -> float | None:
        """When `kill` should happen (monotonic time), or None while its reference moment is unknown."""
        job = self.jobs.get(kill.layer)
        if job is None:
            return None
        ref = job.reference(kill)
        return None if ref is None else ref + kill.after_s

    def _kill(self, kill: Kill, total: int, last: bool = False) -> None:
        job = self.jobs[kill.layer]
        kill.pid, kill.job_state = job.proc.pid, job.last_line()
        kill.tree = 1 + len(descendants(job.proc.pid))
        kill_tree(job.proc)
        left = descendants(job.proc.pid)
        if left:
            raise RuntimeError(f"kill_tree left {left} alive")
        kill.at_s = round(self.now(), 1)
        self.outcome.kills.append(kill)
        self.say(f"[{kill.at_s:6.1f}s] kill {len(self.outcome.kills)}/{total}: {kill.layer} pid {kill.pid} "
                 f"({kill.tree} processes), {kill.after_s}s after {_moment(kill)}; last output: "
                 f"{kill.job_state}")
        if last and self.s.mode == "mixed" and kill.layer == "pipeline":
            # Its locks died with it: the layers now start on the same checkpoints, one process each.
            del self.jobs["pipeline"]
            self.units = LAYERS
            self.say(f"[{self.now():6.1f}s] mixed: the pipeline process is done; each layer now runs on its own")
            return
        self._spawn(kill.layer)

    def run(self) -> Outcome:
        plan = schedule(self.s)
        total = sum(len(v) for v in plan.values())
        self.say(f"chaos: seed {self.s.seed}, {total} kills planned: " + "; ".join(
                     f"{layer} " + ", ".join(f"{k.after_s}s after {_moment(k)}" for k in kills)
                     for layer, kills in plan.items()))
        self.feeding = True
        give_up = time.monotonic() + self.s.max_kill_phase_s
        try:
            while any(plan.values()):
                self._tick()
                for layer, kills in plan.items():
                    due = self._due(kills[0]) if kills else None
                    if due is not None and time.monotonic() >= due:
                        self._kill(kills.pop(0), total, last=not kills)
                if time.monotonic() > give_up:
                    raise RuntimeError(f"kills still pending after {self.now():.0f}s: {plan}; see {self.logs}")
                time.sleep(0.2)
            self.feeding = False
        finally:
            for job in self.jobs.values():
                if job.proc.poll() is None:
                    kill_tree(job.proc)
        self._drain()
        self.outcome.seconds = round(self.now(), 1)
        return self.outcome

    def _drain(self) -> None:
        """Everything that arrived, through every layer: available-now bronze, silver, gold."""
        self.say(f"[{self.now():6.1f}s] drain: available-now bronze, silver, gold")
        log = self.logs / "drain.log"
        env = dict(self.env, TRIGGER="available-now")
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pipeline"], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                self.outcome.drain_code = proc.wait(self.s.drain_timeout_s)
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                self.outcome.drain_code = -9
        self.outcome.drain_log = str(log)
        self.say(f"[{self.now():6.1f}s] drain exit {self.outcome.drain_code}")
        if self.outcome.drain_code != 0:
            tail = log.read_text(errors="replace").splitlines()[-DRAIN_TAIL_LINES:]
            self.say("drain log, last lines:\n" + "\n".join(f"  | {line[:300]}" for line in tail))
