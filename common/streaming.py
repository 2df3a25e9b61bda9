"""What every layer's queries share: triggers and stopping between micro-batches.
(Checkpoint locks: common.checkpoint_lock; errors: common.errors.)"""
from __future__ import annotations

import time

from common.config import Config


def trigger(cfg: Config, layer: str | None = None) -> dict:
    if cfg.streaming.trigger == "available-now":
        return {"availableNow": True}
    return {"processingTime": interval(cfg, layer).spark()}


def interval(cfg: Config, layer: str | None = None):
    """The layer's own processing-time interval, or the shared one. TRIGGER_INTERVAL (or
    --interval) overrides them all."""
    own = getattr(cfg.streaming, f"{layer}_interval", None) if layer else None
    return own if own is not None and not cfg.streaming_interval_forced else cfg.streaming.trigger_interval


def stop_between_batches(query, timeout: float = 600) -> None:
    """Stop when no trigger runs, or as soon as the trigger running now has finished.

    With a backlog (batches slower than the interval, or availableNow) the next trigger starts
    the moment one ends, so an idle moment may never come and waiting for one would drain the
    whole backlog first. A new progress report marks the end of the running trigger; stop() right
    then, before the next batch plans its offsets, or at worst while it starts (it is replayed on
    restart, exactly once through the checkpoint and the appends keyed by batch id).
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


def clear_interrupted_first_batch(checkpoint: str) -> list[str]:
    """Remove what a process killed while logging a query's first batch left in its offset log.

    Spark writes each offset-log entry to a temporary file (".0.<uuid>.tmp", on local disks with
    its ".crc") and renames it into place. Killed between the two, the log holds no batch but is
    not empty, and Spark 4.1 then refuses to start the query for good
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY: a checkpoint without a batch must have empty
    offsets, commits and state folders). With no batch logged nothing was planned, let alone
    committed, so those files are garbage. Anything else (a batch logged, files in commits or
    state) is left for Spark to judge. Call it only while holding the checkpoint's lock.
    Returns the names removed."""
    from common.internals import unlogged_offset_files

    entries = unlogged_offset_files(checkpoint)
    for p in entries:
        p.unlink(missing_ok=True)
    return [p.name for p in entries]
