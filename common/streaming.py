"""Wiring shared by the three jobs: triggers, graceful stop on SIGINT/SIGTERM, job errors."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from common.config import Config
from common.lineage import batch_watermark_ms  # noqa: F401  (re-exported for the jobs)

log = logging.getLogger("lakehouse")


class JobError(RuntimeError):
    """A problem the user can fix (missing input, unreachable broker...): printed, exit code 2."""


def trigger(cfg: Config, layer: str | None = None) -> dict:
    if cfg.streaming.trigger == "available-now":
        return {"availableNow": True}
    return {"processingTime": interval(cfg, layer).spark()}


def interval(cfg: Config, layer: str | None = None):
    """The layer's own processing-time interval, or the shared one. TRIGGER_INTERVAL (or
    --interval) overrides them all."""
    own = getattr(cfg.streaming, f"{layer}_interval", None) if layer else None
    forced = getattr(cfg, "streaming_interval_forced", False)
    return own if own is not None and not forced else cfg.streaming.trigger_interval


def add_trigger_args(parser, cfg_default_help: str = "") -> None:
    parser.add_argument("--trigger", choices=["available-now", "processing-time"],
                        help="available-now (default: from conf/env TRIGGER) processes what is there "
                             "and stops; processing-time runs until SIGINT/SIGTERM")
    parser.add_argument("--interval", help="trigger interval for processing-time, e.g. '10 seconds'")


def apply_trigger_args(args, env: dict) -> dict:
    env = dict(env)
    if getattr(args, "trigger", None):
        env["TRIGGER"] = args.trigger
    if getattr(args, "interval", None):
        env["TRIGGER_INTERVAL"] = args.interval
    return env


class GracefulStop:
    """On SIGINT/SIGTERM, let the running micro-batch finish, then stop the queries."""

    def __init__(self):
        self.requested = threading.Event()

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame):
        if self.requested.is_set():  # a second signal: stop now, the checkpoint keeps us safe
            raise KeyboardInterrupt
        log.warning("signal %s: stopping after the current micro-batch", signal.Signals(signum).name)
        self.requested.set()


def await_queries(queries, stop: GracefulStop, poll: float = 0.5) -> None:
    """Wait for every query to finish; on a stop request, stop each between micro-batches.

    Re-raises the first query failure (StreamingQueryException) after stopping the others.
    """
    try:
        while any(q.isActive for q in queries):
            for q in queries:
                if q.isActive:
                    q.awaitTermination(poll / len(queries))
            if stop.requested.is_set():
                for q in queries:
                    _stop_between_batches(q)
        for q in queries:
            q.awaitTermination()  # raises if the query failed
    except BaseException:
        for q in queries:
            if q.isActive:
                q.stop()
        raise


def _stop_between_batches(query, timeout: float = 600) -> None:
    """Stop when no trigger runs, or as soon as the trigger running now has finished.

    With a backlog (batches slower than the interval, or availableNow) the next trigger starts
    the moment one ends, so an idle moment may never come and waiting for one would drain the
    whole backlog first. A new progress report marks the end of the running trigger; stop() right
    then, before the next batch plans its offsets, or at worst while it starts (it is replayed on
    restart, exactly once through the checkpoint and the Delta sink's batch ids).
    """
    seen = _progress_mark(query)
    deadline = time.monotonic() + timeout
    while (query.isActive and query.status.get("isTriggerActive")
           and _progress_mark(query) == seen and time.monotonic() < deadline):
        time.sleep(0.01)
    if query.isActive:
        query.stop()


def _progress_mark(query):
    progress = query.lastProgress
    return None if progress is None else (progress["runId"], progress["batchId"], progress["timestamp"])


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def failure_message(e: Exception) -> str:
    """The useful part of a failed query's exception: our own message, not the JVM trace."""
    text = str(e)
    marker = "quality gate failed"
    if marker in text:
        text = text[text.index(marker):]
        return text.split("\n\tat ")[0].split("JVM stacktrace")[0].split("\nTraceback")[0].rstrip()
    return text.split("\n\tat ")[0]


class CheckpointLocks:
    """Exclusive locks on the queries' checkpoints, held while a job runs.

    Two processes on one checkpoint would race on its offset log and corrupt it. flock() locks
    die with the process that holds them, so a crashed job never leaves a stale lock."""

    def __init__(self, cfg: Config, queries):
        self.paths = [Path(cfg.checkpoint(q)).with_name(f"{q}.lock") for q in queries]
        self._files = []

    def __enter__(self):
        import fcntl

        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                f.close()
                self.__exit__()
                raise JobError(f"checkpoint {path.with_suffix('')} is in use by {holder}: another "
                               f"instance of this job is running; stop it first") from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.flush()
            self._files.append(f)
        return self

    def __exit__(self, *exc):
        for f in self._files:
            f.close()
        self._files = []


def run_job(cfg: Config, app_name: str, body, queries=()) -> int:
    """Lock the queries' checkpoints, build the session, record query progress
    (ops.query_progress), run body(spark), turn failures into an exit code and a message
    (2: something the user can fix; 1: a query failed, e.g. a quality gate), stop Spark."""
    try:
        with CheckpointLocks(cfg, queries):
            return _run_job(cfg, app_name, body)
    except JobError as e:
        return fail(str(e))


def _run_job(cfg: Config, app_name: str, body) -> int:
    from common.progress import ProgressRecorder
    from common.spark import build_spark

    spark = build_spark(cfg, app_name)
    recorder = ProgressRecorder(spark, cfg)
    spark.streams.addListener(recorder)
    try:
        body(spark)
    except JobError as e:
        return fail(str(e))
    except Exception as e:
        if os.environ.get("LAKEHOUSE_DEBUG"):
            raise
        return fail(failure_message(e), 1)
    finally:
        try:
            recorder.close()
        finally:
            spark.stop()
    return 0
