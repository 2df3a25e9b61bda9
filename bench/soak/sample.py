"""What one soak sample reads: the JVM's and Python's memory, each query's batches and state
(from Spark's listener bus), each table's files and Delta log, each checkpoint folder's size.

No sample starts a Spark job (file listings, Delta's checksum files and a few JVM calls), so
sampling takes nothing from the pipeline's cores; table_operations, which does, runs once at the end.
"""
from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from common.internals import driver_jvm_pid, driver_memory


def _tree(path: Path, skip_hidden: bool = True) -> tuple[int, int]:
    """(files, bytes) under path; hidden files are Hadoop's .crc siblings and temp files."""
    files = size = 0
    for d, _, names in os.walk(path):
        for n in names:
            if skip_hidden and n.startswith("."):
                continue
            try:
                size += os.stat(os.path.join(d, n)).st_size
                files += 1
            except OSError:       # removed by VACUUM or log cleanup while we walk
                pass
    return files, size


def log_read_bytes(log_dir: Path) -> int:
    """Bytes a reader loads for the latest snapshot: the last checkpoint and the commits after it."""
    try:
        since = json.loads((log_dir / "_last_checkpoint").read_text())["version"]
    except (OSError, ValueError, KeyError):
        since = -1
    total = 0
    for f in log_dir.iterdir():
        head = f.name.split(".", 1)[0]
        if not head.isdigit() or f.name.startswith("."):
            continue
        v = int(head)
        if (v > since and f.name.endswith(".json")) or (v == since and ".checkpoint" in f.name):
            try:
                total += f.stat().st_size
            except OSError:
                pass
    sidecars = log_dir / "_sidecars"
    return total + (_tree(sidecars)[1] if since >= 0 and sidecars.is_dir() else 0)


class BatchTap:
    """Every micro-batch's duration, rows and state, from Spark's listener bus."""

    def __init__(self):
        from pyspark.sql.streaming import StreamingQueryListener

        tap = self
        self.lock = threading.Lock()
        self.batches: dict[str, list[tuple[int, int]]] = {}     # query -> [(trigger ms, rows)]
        self.state: dict[str, tuple[int, int]] = {}             # query -> latest (rows, bytes)
        self.rows_seen: dict[str, int] = {}                     # query -> rows read since its start

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                tap.add(event.progress)

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        self.listener = Listener()

    def add(self, p) -> None:
        name = p.name or str(p.id)[:8]
        ops = p.stateOperators or []
        with self.lock:
            self.batches.setdefault(name, []).append((int(p.durationMs.get("triggerExecution") or 0),
                                                      int(p.numInputRows or 0)))
            self.rows_seen[name] = self.rows_seen.get(name, 0) + int(p.numInputRows or 0)
            if ops:
                self.state[name] = (sum(int(o.numRowsTotal or 0) for o in ops),
                                    sum(int(o.memoryUsedBytes or 0) for o in ops))

    def take(self, names) -> dict[str, dict]:
        with self.lock:
            batches, self.batches = self.batches, {}
            state = dict(self.state)
        out = {}
        for q in sorted(set(names) | set(batches)):
            b = batches.get(q, [])
            ms = [d for d, _ in b]
            rows, mem = state.get(q, (None, None))
            out[q] = {"batches": len(b), "input_rows": sum(r for _, r in b),
                      "batch_ms_mean": round(sum(ms) / len(ms)) if ms else None,
                      "batch_ms_max": max(ms) if ms else None, "state_rows": rows, "state_bytes": mem}
        return out


class Sampler:
    """One sample: a few JVM calls, the listener's batches, and file listings; no Spark job."""

    def __init__(self, spark, cfg, tap: BatchTap, queries: list[str]):
        self.spark, self.cfg, self.tap, self.queries = spark, cfg, tap, queries
        self.jvm_pid = driver_jvm_pid(spark)

    def process(self) -> dict:
        from tools.processes import descendants, rss

        # Heap used right after a full collection: the live set, not wherever G1 happened to be
        # between young collections (which swings by the size of the young generation).
        memory = driver_memory(self.spark)
        return {"jvm_rss": rss(self.jvm_pid), "python_rss": rss(os.getpid()),
                "workers_rss": sum(rss(p) or 0 for p in descendants(self.jvm_pid)), **memory}

    def tables(self) -> dict:
        from common.catalog import existing_tables
        from pipeline.maintenance import files_on_disk

        out = {}
        for layer, table, path in existing_tables(self.cfg):
            folder = Path(path)
            live_files, live_bytes = self.live(path)
            log_files, log_bytes = _tree(folder / "_delta_log", skip_hidden=False)
            disk_bytes = _tree(folder, skip_hidden=False)[1] - log_bytes
            out[f"{layer}.{table}"] = {"live_files": live_files, "live_bytes": live_bytes,
                                       "disk_files": files_on_disk(folder), "disk_bytes": disk_bytes,
                                       "log_files": log_files, "log_bytes": log_bytes,
                                       "log_read_bytes": log_read_bytes(folder / "_delta_log")}
        return out

    @staticmethod
    def live(path: str) -> tuple[int | None, int | None]:
        """Files and bytes of the table, from the checksum Delta writes beside each commit: no
        Spark job, so sampling takes nothing from the pipeline's cores. The newest commit's is
        written just after the commit; until then the one before stands in (one commit old)."""
        log_dir = Path(path) / "_delta_log"
        for crc in sorted(log_dir.glob("[0-9]*.crc"), reverse=True):
            try:
                figures = json.loads(crc.read_text())
                return int(figures["numFiles"]), int(figures["tableSizeBytes"])
            except (OSError, ValueError, KeyError):
                continue
        return None, None

    def checkpoints(self) -> dict:
        root = Path(self.cfg.checkpoint_root)
        out = {q.name: _tree(q, skip_hidden=False)[1] for q in sorted(root.iterdir()) if q.is_dir()} \
            if root.is_dir() else {}
        out["total"] = sum(out.values())
        return out

    def sample(self, t0: float) -> dict:
        now = time.time()
        s = {"t": round(now - t0, 1), "at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
             "load1": round(os.getloadavg()[0], 2)}
        took = {}
        for part, fn in (("process", self.process), ("queries", lambda: self.tap.take(self.queries)),
                         ("tables", self.tables), ("checkpoints", lambda: {
                             k: {"checkpoint_bytes": v} for k, v in self.checkpoints().items()})):
            started = time.monotonic()
            s[part] = fn()
            took[part] = round(time.monotonic() - started, 2)
        s["took_s"] = took
        return s


def table_operations(spark, cfg) -> dict[str, dict[str, int]]:
    """Operations per table over the whole run (OPTIMIZE and VACUUM show maintenance ran)."""
    from common.catalog import existing_tables

    out = {}
    for layer, table, path in existing_tables(cfg):
        rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").groupBy("operation").count().collect()
        out[f"{layer}.{table}"] = {r["operation"]: r["count"] for r in sorted(rows, key=lambda r: r["operation"])}
    return out
