"""Landing-to-gold latency from commit lineage, read straight from the checkpoints and Delta
logs on disk (no Spark, nothing added to the product).

For each landed file:
  bronze batch     the file source's log (`_checkpoints/bronze_files/sources/0/`) names the
                   micro-batch that read it;
  bronze version   the commit whose lineage (userMetadata) names that batch (before bronze
                   appended through foreachBatch: the Delta sink's txn (query id, batch id));
  silver version   the first silver.camera_events commit whose lineage (userMetadata) says it
                   consumed bronze up to that version or later;
  gold version     likewise, the first gold commit that consumed that silver version or later.
Latency = gold commit timestamp - the file's landing time.
"""
from __future__ import annotations

import json
from pathlib import Path

from common.lineage import parse


def delta_commits(table_path: str) -> list[dict]:
    """Every commit of a Delta table: version, timestamp (s), lineage, streaming txns and the
    data files it added."""
    out = []
    log = Path(table_path) / "_delta_log"
    for f in sorted(log.glob("[0-9]*.json")):
        info, txns, adds = {}, [], []
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
            elif "txn" in action:
                txns.append((action["txn"]["appId"], int(action["txn"]["version"])))
            elif "add" in action:
                adds.append(action["add"]["path"])
        ts = info.get("inCommitTimestamp") or info.get("timestamp")
        out.append({"version": int(f.stem), "ts": ts / 1000 if ts else None,
                    "lineage": parse(info.get("userMetadata")), "txns": txns, "adds": adds})
    return out


def file_batches(checkpoint: str) -> dict[str, int]:
    """File name -> the file source batch that read it (plain and .compact log files)."""
    from common.internals import file_source_log

    out: dict[str, int] = {}
    for entry in file_source_log(checkpoint):
        out.setdefault(entry["path"].rsplit("/", 1)[-1], int(entry["batchId"]))
    return out


def _first_consuming(commits: list[dict], upstream_version: int) -> dict | None:
    for c in commits:
        lin = c["lineage"]
        v = lin and lin["upstream"]["version"]
        if v is not None and v >= upstream_version:
            return c
    return None


def file_latencies(cfg, landed: dict[str, float], gold_tables: list[str]) -> list[dict]:
    """One row per landed file: landing time and when bronze, silver and each gold table made
    it visible (None: not yet)."""
    batches = file_batches(cfg.checkpoint("bronze_files"))
    bronze = delta_commits(cfg.table_path("bronze", "events"))
    bronze_by_batch = {}
    for c in bronze:
        lineage_batch = (c["lineage"] or {}).get("batch_id")
        for batch in [b for _app, b in c["txns"]] + ([lineage_batch] if isinstance(lineage_batch, int) else []):
            bronze_by_batch.setdefault(batch, c)
    silver = [c for c in delta_commits(cfg.table_path("silver", "camera_events")) if c["lineage"]]
    gold = {t: [c for c in delta_commits(cfg.table_path("gold", t)) if c["lineage"]] for t in gold_tables}
    rows = []
    for name, t_landed in sorted(landed.items(), key=lambda kv: kv[1]):
        row = {"file": name, "landed": t_landed, "bronze": None, "silver": None,
               **{t: None for t in gold_tables}}
        b = bronze_by_batch.get(batches.get(name, -1))
        s = _first_consuming(silver, b["version"]) if b else None
        if b:
            row["bronze"] = b["ts"] - t_landed
        if s:
            row["silver"] = s["ts"] - t_landed
            for t in gold_tables:
                g = _first_consuming(gold[t], s["version"])
                row[t] = g["ts"] - t_landed if g else None
        rows.append(row)
    return rows


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def summarize(rows: list[dict], column: str, observed_until: float | None = None) -> dict:
    """p50/p95 over the files. A file not visible by `observed_until` counts with the time it
    had waited by then, so a pipeline that falls behind shows it (the figures become lower
    bounds, and `censored` says how many files were still waiting)."""
    seen = [r[column] for r in rows if r[column] is not None]
    waiting = [observed_until - r["landed"] for r in rows if r[column] is None] if observed_until else []
    values = seen + waiting
    return {"files": len(rows), "visible": len(seen), "censored": len(waiting),
            "p50_s": _r(percentile(values, 50)), "p95_s": _r(percentile(values, 95)),
            "max_s": _r(max(values) if values else None)}


def _r(x):
    return None if x is None else round(x, 2)
