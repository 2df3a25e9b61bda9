"""Where a streaming batch's time goes, job by job, at light load (issue 60).

    python -m bench.batch_profile [--files 4] [--gap 40] [--keep]

Runs (h)'s quiet feed (bench/run.py quiet_phase: processing-time `run-all`, one file of 500
events every --gap seconds, so each layer's batches run with nothing else on the cores) with
Spark's UI on, and before the pipeline stops reads Spark's REST API: every job with its SQL
execution, mapped to the batch that ran it (the job group Structured Streaming sets is the run
id; the batch's span comes from ops.query_progress). For the last data batch and the last
watermark-only batch of silver and of gold it prints each job (what it executes: its SQL
plan's first nodes from the scan up, or Delta's own description), its wall time and tasks, and the batch's time in
no job at all: the driver's Python (the batch function, GX), Delta's commits, planning.

The UI costs a little per job; the figures are for reading shares, not for (h)'s target.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from datetime import datetime
from pathlib import Path

from bench import run

LAYERS = ("silver", "gold")


def rest(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=30) as r:
        return json.loads(r.read())


def find_app(ports=range(4040, 4050)) -> tuple[int, str]:
    for port in ports:
        try:
            apps = rest(port, "applications")
        except OSError:
            continue
        if apps:
            return port, apps[0]["id"]
    raise run.BenchError("no Spark UI found on ports 4040-4049 (is spark.ui_enabled on?)")


def _ms(ts: str | None) -> float | None:
    if not ts:
        return None
    return datetime.strptime(ts.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


def what(job: dict, executions: dict[int, dict]) -> str:
    """A job's label: Delta's description when it set one, else its SQL plan's first nodes."""
    desc = (job.get("description") or "").strip()
    # Delta prefixes the streaming batch's description with "Delta: " and ends it with its own.
    said = re.search(r"batch = \d+: (.+)$", desc)
    if desc.startswith("Delta: ") and said:
        return f"Delta: {said.group(1)}"[:90]
    if desc and "runId" not in desc:
        return desc.splitlines()[0][:90]
    sql = executions.get(job["jobId"])
    if sql:
        nodes = [n["nodeName"] for n in sql.get("nodes", [])][:3]
        return " <- ".join(nodes)[:90] or sql.get("description", "")[:90]
    return job.get("name", "?")[:90]


def snapshot(port: int, app: str) -> dict:
    jobs = rest(port, f"applications/{app}/jobs")
    executions = {}
    for e in rest(port, f"applications/{app}/sql?details=true&planDescription=false&length=100000"):
        for j in (e.get("successJobIds") or []) + (e.get("failedJobIds") or []) + (e.get("runningJobIds") or []):
            executions[j] = e
    # Each stage's tasks' summed time: a job's wall beside its tasks' work tells a job that
    # waited (for a core, for its shuffle's other side) from one that worked.
    stages = {str(s["stageId"]): {"run_ms": s.get("executorRunTime", 0)}
              for s in rest(port, f"applications/{app}/stages")}
    return {"jobs": jobs, "executions": {str(k): v for k, v in executions.items()}, "stages": stages}


def batches(cfg, session) -> list[dict]:
    path = cfg.table_path("ops", "query_progress")
    return session.sql(
        f"SELECT query_name, run_id, batch_id, input_rows, batch_duration_ms, "
        f"unix_millis(timestamp) AS start_ms FROM delta.`{path}` "
        f"WHERE event = 'progress' AND batch_id IS NOT NULL ORDER BY query_name, batch_id")


def work(job: dict, stages: dict) -> int:
    """The job's tasks' summed run time (ms), over the stages it ran (a skipped one is absent)."""
    return sum(stages.get(str(s), {}).get("run_ms", 0) for s in job.get("stageIds", ()))


def profile(batch: dict, jobs: list[dict], executions: dict[int, dict], stages: dict | None = None) -> dict:
    start, end = batch["start_ms"], batch["start_ms"] + batch["batch_duration_ms"]
    mine = []
    for j in jobs:
        t0, t1 = _ms(j.get("submissionTime")), _ms(j.get("completionTime"))
        if t0 is None or t1 is None or j.get("jobGroup") != batch["run_id"] or not start <= t0 <= end:
            continue
        mine.append({"job": j["jobId"], "what": what(j, executions), "ms": round(t1 - t0),
                     "tasks": j.get("numTasks"), "t0": t0, "t1": t1, "task_ms": work(j, stages or {})})
    covered, last = 0.0, start
    for j in sorted(mine, key=lambda j: j["t0"]):
        if j["t1"] > last:
            covered += j["t1"] - max(j["t0"], last)
            last = j["t1"]
    return {"query": batch["query_name"], "batch": batch["batch_id"], "rows": batch["input_rows"],
            "ms": batch["batch_duration_ms"], "jobs": sorted(mine, key=lambda j: j["t0"]),
            "in_jobs_ms": round(covered), "outside_jobs_ms": round(batch["batch_duration_ms"] - covered)}


def kind(label: str) -> str:
    """A job's kind, for the batch's totals."""
    if "Delta Table State" in label:
        return "Delta table state rebuilt (a new version's snapshot: transaction key, file list)"
    if "InMemoryTableScan" in label:
        return "reads of the batch's cache (the first one runs the streaming plan and fills it)"
    if label.startswith("Scan ExistingRDD"):
        # Silver pins its parsed batch and gold its updates (BatchContext.pin): both scan an RDD,
        # as the micro-batch's own plan does when a write runs it (its observed metrics).
        return "reads of pinned rows or of the micro-batch's plan (the first read computes them)"
    if label.startswith("Scan parquet"):
        return "scans of Delta tables (folds, MERGE, gate views)"
    if label.startswith("Delta: "):
        return "Delta's own jobs (file filtering, MERGE's touched files, stats)"
    if label.startswith(("Range", "LocalTableScan")):
        return "local rows (accounting, lineage, ops appends)"
    return "other"


def totals(p: dict) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for j in p["jobs"]:
        t = out.setdefault(kind(j["what"]), [0, 0])
        t[0], t[1] = t[0] + 1, t[1] + j["ms"]
    return {k: (n, ms) for k, (n, ms) in sorted(out.items(), key=lambda kv: -kv[1][1])}


def render(p: dict) -> str:
    kind = "data" if p["rows"] else "watermark-only"
    out = [f"{p['query']} batch {p['batch']} ({kind}, {p['rows']} rows): {p['ms'] / 1000:.2f} s, "
           f"{len(p['jobs'])} jobs covering {p['in_jobs_ms'] / 1000:.2f} s, "
           f"{p['outside_jobs_ms'] / 1000:.2f} s in no job (driver: Python, Delta commits, planning)"]
    t = p["jobs"][0]["t0"] if p["jobs"] else 0
    for j in p["jobs"]:
        out.append(f"  +{(j['t0'] - t) / 1000:6.2f} s  {j['ms']:6,} ms  {j['tasks'] or 0:3} tasks "
                   f"{j.get('task_ms', 0):6,} ms in tasks  {j['what']}")
    out.append("  by kind (job times summed; jobs run side by side, so they can exceed the wall):")
    out += [f"    {n:3} jobs {ms:7,} ms  {k}" for k, (n, ms) in totals(p).items()]
    return "\n".join(out)


def medians(rows: list[dict]) -> str:
    """Every batch of the run but each query's first, by query and kind: one batch's profile
    is one sample, on a machine whose timings vary by ±15 %."""
    from statistics import median

    return "\n".join(f"{layer} {'data' if data else 'watermark-only'} batches: {len(some)}, "
                     f"median {median(b['batch_duration_ms'] for b in some) / 1000:.2f} s"
                     for layer, data, some in kinds(rows))


def kinds(rows: list[dict]):
    """(layer, data?, its batches but the query's first) for each layer and kind that ran any."""
    for layer in LAYERS:
        for data in (True, False):
            some = [b for b in rows
                    if b["query_name"] == layer and b["batch_id"] > 0 and bool(b["input_rows"]) == data]
            if some:
                yield layer, data, some


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=4, help="files in the quiet feed (default 4)")
    p.add_argument("--gap", type=float, default=40, help="seconds between them (default 40)")
    p.add_argument("--out", type=Path, default=run.OUT / "batch-profile",
                   help="where the lakehouse and the raw profile go (default bench-results/batch-profile)")
    a = p.parse_args(argv)
    args = run.parse_args(["--only", "h", "--quiet-files", str(a.files), "--quiet-gap", f"{a.gap:g}"])
    a.out.mkdir(parents=True, exist_ok=True)
    seen: dict = {}

    def before_stop():
        seen.update(snapshot(*find_app()))

    cfg = run.quiet_phase(args, a.out, extra_env={"LAKEHOUSE__SPARK__UI_ENABLED": "true"}, before_stop=before_stop)
    session = run.Session(cfg)
    try:
        rows = batches(cfg, session)
    finally:
        session.stop()
    executions = {int(k): v for k, v in seen["executions"].items()}
    chosen = [profile(some[-1], seen["jobs"], executions, seen["stages"]) for _, _, some in kinds(rows)]
    (a.out / "profile.json").write_text(json.dumps({"batches": rows, "profiles": chosen, **seen}, indent=1, default=str))
    for prof in chosen:
        print(render(prof), end="\n\n")
    print(medians(rows))
    print(f"raw: {a.out / 'profile.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
