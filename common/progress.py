"""ops.query_progress: every progress event of every streaming query, and a log line per batch
(logger common.progress, INFO; its structured fields in --log-json mode).

A StreamingQueryListener sees each progress report on Spark's listener bus, which runs apart
from the query threads. The listener only formats the row and the log line and puts the row on
a queue; a writer thread appends the queue to Delta every `monitoring.progress_flush`, so a
Delta commit never sits between two micro-batches.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from datetime import datetime, timezone

from pyspark.sql.streaming import StreamingQueryListener

from common.config import Config
from common.delta import ensure_table
from common.literal_frame import local_frame
from common.lineage import PIPELINE, to_user_metadata
from common.log import fields
from common.schemas import QUERY_PROGRESS

log = logging.getLogger(__name__)

PROGRESS_COMMIT = to_user_metadata({"pipeline": PIPELINE, "made_by": "progress log"})


def _ts(text: str | None):
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _offset(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def source_lag(sources: list[dict]) -> tuple[int | None, str | None]:
    """How far each source's end offset is behind its latest: Kafka messages, Delta versions."""
    lag, unit = None, None
    for s in sources:
        end, latest = _offset(s.get("endOffset")), _offset(s.get("latestOffset"))
        if not isinstance(end, dict) or not isinstance(latest, dict):
            continue
        if "reservoirVersion" in end and "reservoirVersion" in latest:
            behind, kind = max(0, int(latest["reservoirVersion"]) - int(end["reservoirVersion"])), "versions"
        else:  # Kafka: {topic: {partition: offset}}
            behind, kind = 0, "messages"
            for topic, parts in latest.items():
                for part, off in (parts or {}).items():
                    behind += max(0, int(off) - int((end.get(topic) or {}).get(part, off)))
        lag, unit = (lag or 0) + behind, kind
    return lag, unit


def progress_row(p: dict) -> dict:
    ops = p.get("stateOperators") or []
    lag, unit = source_lag(p.get("sources") or [])
    return {
        "event": "progress", "query_name": p.get("name"), "query_id": p["id"], "run_id": p["runId"],
        "batch_id": p.get("batchId"), "timestamp": _ts(p.get("timestamp")),
        "input_rows": int(p.get("numInputRows") or 0),
        "input_rows_per_second": float(p.get("inputRowsPerSecond") or 0.0),
        "processed_rows_per_second": float(p.get("processedRowsPerSecond") or 0.0),
        "batch_duration_ms": p.get("batchDuration"),
        "duration_ms": {k: int(v) for k, v in (p.get("durationMs") or {}).items()},
        "state_rows": sum(int(o.get("numRowsTotal") or 0) for o in ops) if ops else None,
        "state_memory_bytes": sum(int(o.get("memoryUsedBytes") or 0) for o in ops) if ops else None,
        "watermark": _ts((p.get("eventTime") or {}).get("watermark")),
        "source_lag": lag, "lag_unit": unit,
        "sources": json.dumps(p.get("sources") or []), "error": None,
    }


def log_line(row: dict) -> str:
    """`silver  batch 42  12,345 rows  8,210 rows/s  1.5 s  wm 12:04`"""
    wm = row["watermark"]
    wm_text = wm.strftime("%H:%M") if wm and wm.year > 1970 else "-"
    return (f"{row['query_name'] or row['query_id'][:8]:<8}  batch {row['batch_id']}  "
            f"{row['input_rows']:,} rows  {row['processed_rows_per_second']:,.0f} rows/s  "
            f"{(row['batch_duration_ms'] or 0) / 1000:.1f} s  wm {wm_text}")


class ProgressRecorder(StreamingQueryListener):
    """Register with spark.streams.addListener; call close() before the session stops."""

    def __init__(self, spark, cfg: Config):
        self.spark, self.cfg = spark, cfg
        self.path = cfg.table_path("ops", "query_progress")
        self._created = False
        self.flush_seconds = cfg.monitoring.progress_flush.seconds
        self.log_batches = cfg.monitoring.log_batches
        self._rows: queue.Queue = queue.Queue()
        # Run id -> name. By run, not by query id: a query started again on its checkpoint keeps
        # its id, Spark calls onQueryStarted synchronously in start() but delivers the last run's
        # termination later, on its bus, and that termination must not take the new run's entry.
        self._running: dict[str, str | None] = {}
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._run, name="progress-writer", daemon=True)
        self._writer.start()

    # --- listener callbacks (Spark's listener bus thread) ---
    def onQueryStarted(self, event) -> None:
        self._running[str(event.runId)] = event.name
        # A query that has run no batch yet (nothing new to read) is running all the same.
        self._rows.put({"event": "started", "query_name": event.name, "query_id": str(event.id),
                        "run_id": str(event.runId), "timestamp": datetime.now(timezone.utc)})

    def onQueryProgress(self, event) -> None:
        row = progress_row(json.loads(event.progress.json))
        self._rows.put(row)
        if self.log_batches:
            log.info(log_line(row), extra=fields(
                event="batch", query=row["query_name"], query_id=row["query_id"], batch_id=row["batch_id"],
                rows=row["input_rows"], rows_per_second=round(row["processed_rows_per_second"], 1),
                seconds=(row["batch_duration_ms"] or 0) / 1000, watermark=row["watermark"],
                source_lag=row["source_lag"]))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        name = self._running.pop(str(event.runId), None)
        self._rows.put({"event": "terminated", "query_name": name, "query_id": str(event.id),
                        "run_id": str(event.runId), "timestamp": datetime.now(timezone.utc),
                        "error": event.exception})

    # --- writer thread ---
    def _run(self) -> None:
        # The table is created here, not on the caller's path: the first Delta commit of a JVM
        # takes about a second, and the first rows come a flush interval after the start.
        self._ensure_table()
        while not self._stop.wait(self.flush_seconds):
            self.flush()

    def _ensure_table(self) -> None:
        # Failing here ends the writer thread; close() then tries again and raises in its caller.
        if not self._created:
            ensure_table(self.spark, self.cfg, "ops", "query_progress", QUERY_PROGRESS)
            self._created = True

    def flush(self) -> int:
        rows = []
        while True:
            try:
                rows.append(self._rows.get_nowait())
            except queue.Empty:
                break
        if not rows:
            return 0
        self._ensure_table()
        now = datetime.now(timezone.utc)
        fields = QUERY_PROGRESS.fieldNames()
        data = [tuple({**dict.fromkeys(fields), **r, "recorded_at": now}[f] for f in fields) for r in rows]
        # Marked as the pipeline's, so the audit does not list its own progress log as made outside it.
        (local_frame(self.spark, data, QUERY_PROGRESS).write.format("delta").mode("append")
         .option("userMetadata", PROGRESS_COMMIT).save(self.path))
        return len(rows)

    def close(self, wait_seconds: float = 5.0) -> None:
        """Stop the writer and write what is left. The bus delivers events after the queries
        have returned, so first give it a moment to report every query's termination."""
        import time

        deadline = time.monotonic() + wait_seconds
        while self._running and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._writer.join()
        self.flush()
