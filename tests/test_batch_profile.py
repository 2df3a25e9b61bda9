"""bench/batch_profile.py's reading of Spark's REST answers: which jobs belong to a batch, how
much of the batch they cover, and their kinds (the run itself needs a pipeline and Spark's UI:
`python -m bench.batch_profile`)."""
from __future__ import annotations

from bench import batch_profile as B


def _job(job_id, group, t0, t1, description="", tasks=2, stages=()):
    stamp = lambda ms: f"2026-11-30T10:00:{ms // 1000:02d}.{ms % 1000:03d}GMT"  # noqa: E731
    return {"jobId": job_id, "jobGroup": group, "submissionTime": stamp(t0), "completionTime": stamp(t1),
            "description": description, "numTasks": tasks, "name": "run at NativeMethodAccessorImpl.java:0",
            "stageIds": list(stages)}


def test_a_batch_s_jobs_are_its_run_s_within_its_span_and_their_union_is_what_they_cover():
    base = int(B._ms("2026-11-30T10:00:00.000GMT"))
    batch = {"query_name": "gold", "run_id": "run-1", "batch_id": 7, "input_rows": 439,
             "start_ms": base + 1_000, "batch_duration_ms": 4_000}
    jobs = [_job(1, "run-1", 1_000, 2_000, stages=(10, 11)),    # the streaming plan
            _job(2, "run-1", 1_500, 2_500,                      # beside it
                 "Delta: gold\nid = q\nrunId = run-1\nbatch = 7: Filtering files for query"),
            _job(3, "run-1", 3_000, 3_200),
            _job(4, "run-2", 1_200, 1_400),                     # another query's
            _job(5, "run-1", 5_500, 5_600)]                     # the next batch's
    executions = {1: {"nodes": [{"nodeName": "Scan ExistingRDD"}, {"nodeName": "InMemoryTableScan"},
                                {"nodeName": "CollectMetrics"}, {"nodeName": "Project"}]},
                  3: {"nodes": [{"nodeName": "Scan parquet"}, {"nodeName": "Filter"}]}}
    stages = {"10": {"run_ms": 300}, "11": {"run_ms": 450}}     # stage 12 skipped: absent
    p = B.profile(batch, jobs, executions, stages)
    assert [j["job"] for j in p["jobs"]] == [1, 2, 3]
    assert [j["task_ms"] for j in p["jobs"]] == [750, 0, 0]
    assert p["in_jobs_ms"] == 1_700 and p["outside_jobs_ms"] == 2_300     # [1.0, 2.5] + [3.0, 3.2]
    assert [j["what"] for j in p["jobs"]] == ["Scan ExistingRDD <- InMemoryTableScan <- CollectMetrics",
                                              "Delta: Filtering files for query", "Scan parquet <- Filter"]
    kinds = B.totals(p)
    assert kinds[B.kind("Scan parquet <- Filter")] == (1, 200)
    assert sum(n for n, _ in kinds.values()) == 3
    text = B.render(p)
    assert text.startswith("gold batch 7 (data, 439 rows): 4.00 s, 3 jobs covering 1.70 s, 2.30 s in no job")


def test_medians_leave_out_each_query_s_first_batch_and_split_data_from_watermark_only():
    rows = [{"query_name": "gold", "batch_id": 0, "input_rows": 500, "batch_duration_ms": 30_000},
            {"query_name": "gold", "batch_id": 1, "input_rows": 400, "batch_duration_ms": 8_000},
            {"query_name": "gold", "batch_id": 2, "input_rows": 0, "batch_duration_ms": 900},
            {"query_name": "gold", "batch_id": 3, "input_rows": 300, "batch_duration_ms": 6_000},
            {"query_name": "silver", "batch_id": 1, "input_rows": 0, "batch_duration_ms": 500}]
    assert B.medians(rows).splitlines() == ["silver watermark-only batches: 1, median 0.50 s",
                                            "gold data batches: 2, median 7.00 s",
                                            "gold watermark-only batches: 1, median 0.90 s"]
