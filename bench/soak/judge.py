"""The soak's judgement: which series it samples (KINDS), when each can be flat (settle_s), and
whether it grew (judge: the second half's mean against the first's); the summary table.

Pure functions of the samples, so tests/test_soak.py checks them on synthetic series.
"""
from __future__ import annotations

MB = 1024 * 1024

# kind -> (scope, unit, absolute floor or None when only charted). A series fails when its
# second-half mean exceeds the first half's by more than growth_limit AND by more than the
# floor: below the floor a relative change is noise, not a leak (a 10-file table gaining 5
# files is +50%, a 0.4 s batch taking 0.6 s is +50% of nothing). Each floor is above what one
# sample moves by in a steady run and well below what would matter over weeks.
KINDS: dict[str, tuple[str, str, float | None]] = {
    # The JVM's RSS moves by hundreds of MB between samples as G1 commits and gives back heap
    # regions (up to spark.driver_memory); a leak that matters over weeks is GBs.
    "jvm_rss": ("process", "bytes", 256 * MB),
    "python_rss": ("process", "bytes", 64 * MB),
    # Sum over the JVM's Python workers: shared pages are counted once per worker, and workers
    # come and go with the pandas UDFs that need them, so the sum is a trace, not a figure.
    "workers_rss": ("process", "bytes", None),
    # Heap after a full GC still holds the batches in flight at that moment (a MERGE's rows, a
    # snapshot being rebuilt): it moves by a few hundred MB from one sample to the next.
    "heap_used": ("process", "bytes", 256 * MB),
    # Metaspace and code cache: the JIT keeps compiling for tens of minutes; charted only.
    "nonheap_used": ("process", "bytes", None),
    "batch_ms_mean": ("query", "ms", 1000),
    "batch_ms_max": ("query", "ms", None),
    "batches": ("query", "count", None),
    "input_rows": ("query", "rows", None),
    "state_rows": ("query", "rows", 2000),
    # RocksDB's memory figure includes block cache and memtables, which fill by the MB.
    "state_bytes": ("query", "bytes", 16 * MB),
    "live_files": ("table", "files", 50),
    # Data accumulates by design (bronze keeps every event): bytes are charted, files judged.
    "live_bytes": ("table", "bytes", None),
    "disk_files": ("table", "files", 100),
    "disk_bytes": ("table", "bytes", None),
    "log_files": ("table", "files", None),
    # Delta deletes expired log files only up to the UTC midnight before now - log_retention
    # (MetadataCleanup truncates its cut-off to the day), so within a day the log grows with
    # every commit whatever the retention: charted, with its growth per hour. What a reader
    # loads for the latest snapshot (last checkpoint + commits after it) is what must stay flat.
    "log_bytes": ("table", "bytes", None),
    "log_read_bytes": ("table", "bytes", 4 * MB),
    "checkpoint_bytes": ("checkpoint", "bytes", 8 * MB),
}
# Series bounded by retention can only flatten once a full retention has passed (VACUUM keeps
# removed files that long; Delta checkpoints keep their tombstones that long).
RETENTION_BOUND = {"disk_files", "log_read_bytes"}
# Series that follow how often batches run grow when other processes take the cores, not only
# when the pipeline degrades: batch durations, and the rows a stateful query holds, since a
# query keeps all of a batch's rows until the next batch's watermark passes them, so a batch
# starved for two minutes holds two minutes of the feed (a soak beside the suite saw silver's
# state go from 898 to 3,434 rows while its batches took 118-161 s). They are judged on the
# samples during which others took at most this share of the machine, and "contended"
# (charted, not a finding) when too few such samples are left.
PACED = {"batch_ms_mean", "state_rows"}
# A query's state fills until its oldest entries leave by the watermark: silver's dedup keys
# after silver.dedup_watermark of event time, gold's open sessions after gold's watermark and
# a session gap; in a soak that is that span over soak.event_time_speedup of clock
# (`state_horizon_s`, two minutes with the conf's), which a short soak may not reach.
STATE = {"state_rows", "state_bytes"}
MAX_OTHERS_SHARE = 0.25


def series(samples: list[dict]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(kind, subject) -> [(t seconds, value)]; subject '' for process figures."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in samples:
        for kind, v in s.get("process", {}).items():
            if v is not None:
                out.setdefault((kind, ""), []).append((s["t"], v))
        for group in ("queries", "tables", "checkpoints"):
            for subject, figures in s.get(group, {}).items():
                for kind, v in figures.items():
                    if v is not None:
                        out.setdefault((kind, subject), []).append((s["t"], v))
    return out


def judge(values: list[float], floor: float, limit: float) -> dict:
    """Second-half mean against first-half mean: grows when above it by more than `limit`
    (relative) and more than `floor` (absolute). Fewer than 4 values: too short to tell."""
    if len(values) < 4:
        return {"verdict": "short", "n": len(values)}
    half = len(values) // 2
    # With an odd count the middle value goes to neither half, so both halves weigh the same.
    first, second = values[:half], values[len(values) - half:]
    a, b = sum(first) / len(first), sum(second) / len(second)
    grows = b > a * (1 + limit) and b - a > floor
    return {"verdict": "GROWS" if grows else "pass", "n": len(values), "first_half": a, "second_half": b,
            "ratio": round(b / a, 3) if a else None}


# Spark's state stores snapshot every spark.sql.streaming.stateStore.minDeltasForSnapshot (10)
# batches and clean up only behind the snapshot before the oldest batch retained.
SNAPSHOT_DELTAS = 10


def settle_s(kind: str, ctx: dict) -> float:
    """When a kind's series can be flat: after warmup, and after a full retention (plus one
    maintenance round) for retention-bound ones, once the state can be full (STATE) for state
    rows and bytes, and for checkpoint folders once every stateful query has made
    min_batches_to_retain + SNAPSHOT_DELTAS batches (older ones are only then cleaned up):
    counted from the samples when known (a query slower than its trigger takes longer than its
    interval suggests), else estimated from the slowest trigger interval."""
    if kind in RETENTION_BOUND:
        return max(ctx["warmup_s"], ctx["retention_s"] + ctx["maintenance_interval_s"])
    if kind in STATE:
        return max(ctx["warmup_s"], ctx.get("state_horizon_s", 0))
    if kind == "checkpoint_bytes":
        estimate = (ctx["min_batches_to_retain"] + SNAPSHOT_DELTAS) * ctx["slowest_interval_s"]
        return max(ctx["warmup_s"], ctx.get("checkpoint_settled_s", estimate))
    return ctx["warmup_s"]


def checkpoint_settled_s(samples: list[dict], batches_needed: int, never: float) -> float:
    """The first sample time by which every stateful query has made `batches_needed` batches
    since sampling began; `never` when one has not by the end."""
    done: dict[str, float] = {}
    counts: dict[str, int] = {}
    stateful = {q for s in samples for q, v in s.get("queries", {}).items() if v.get("state_rows") is not None}
    for s in samples:
        for q in stateful:
            counts[q] = counts.get(q, 0) + (s.get("queries", {}).get(q, {}).get("batches") or 0)
            if counts[q] >= batches_needed and q not in done:
                done[q] = s["t"]
    return max(done.values()) if stateful and len(done) == len(stateful) else never


def window_mean(points, lo: float, hi: float) -> float | None:
    v = [x for t, x in points if lo < t <= hi]
    return sum(v) / len(v) if v else None


def verdicts(samples: list[dict], ctx: dict, limit: float) -> list[dict]:
    """One row per series: first and last window means (the report's figures), the halves
    judged and the verdict (info for series that are only charted)."""
    run_s = ctx["run_s"]
    if "checkpoint_settled_s" not in ctx:
        ctx = dict(ctx, checkpoint_settled_s=checkpoint_settled_s(
            samples, ctx["min_batches_to_retain"] + SNAPSHOT_DELTAS, never=run_s + 1))
    win = 300 if run_s >= 20 * 60 else run_s / 4     # first vs last 5 min; a quarter for short runs
    busy = {s["t"] for s in samples if (s.get("others_cpu_share") or 0) > MAX_OTHERS_SHARE}
    rows = []
    for (kind, subject), points in sorted(series(samples).items()):
        if kind not in KINDS:
            continue
        scope, unit, floor = KINDS[kind]
        if scope == "checkpoint" and subject != "total":
            floor = None            # per query charted, the folder as a whole judged
        row = {"series": kind + (f"[{subject}]" if subject else ""), "kind": kind, "subject": subject,
               "unit": unit, "first_window": window_mean(points, -1, win),
               "last_window": window_mean(points, run_s - win, run_s + 1), "window_s": win}
        if floor is None:
            row["verdict"] = "info"
        else:
            start = settle_s(kind, ctx)
            judged = [(t, v) for t, v in points if t >= start]
            contended = False
            if kind in PACED:
                quiet = [(t, v) for t, v in judged if t not in busy]
                if len(quiet) < len(judged):
                    row["contended_samples"] = len(judged) - len(quiet)
                    # Halves of quiet samples from one end of the run alone would compare
                    # nothing: each half of the run must keep two.
                    middle = judged[len(judged) // 2][0] if judged else 0
                    contended = (sum(t < middle for t, _ in quiet) < 2 or sum(t >= middle for t, _ in quiet) < 2)
                judged = quiet
            row.update(judge([v for _, v in judged], floor, limit), judged_from_s=start, floor=floor)
            if contended:
                row["verdict"] = "contended"
        if kind == "log_bytes" and len(points) > 1 and points[-1][0] > points[0][0]:
            row["per_hour"] = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) * 3600
        rows.append(row)
    return rows


def fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return f"{value / MB:,.1f} MB"
    if unit == "ms":
        return f"{value / 1000:,.2f} s"
    return f"{value:,.0f}"


def summary_table(rows: list[dict], judged_only: bool = False) -> str:
    """The judged series (and the Delta log's growth per hour); every series with judged_only off."""
    if judged_only:
        rows = [r for r in rows if r["verdict"] != "info" or "per_hour" in r]
    win = rows[0]["window_s"] / 60 if rows else 5
    head = (f"{'series':<44} {'first ' + format(win, 'g') + ' min':>13} {'last ' + format(win, 'g') + ' min':>13} "
            f"{'2nd/1st half':>12}  verdict")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else ""
        verdict = r["verdict"] + (f" (from {r['judged_from_s'] / 60:g} min)" if r["verdict"] == "short" else "")
        if "per_hour" in r:
            verdict += f" (+{fmt(r['per_hour'], r['unit'])}/h)"
        lines.append(f"{r['series'][:44]:<44} {fmt(r['first_window'], r['unit']):>13} "
                     f"{fmt(r['last_window'], r['unit']):>13} {ratio:>12}  {verdict}")
    return "\n".join(lines)
