"""The watermark closes what it passes without waiting for new data: after a demo-sized
available-now run, every session whose gap is behind the final watermark is closed, every window
ending at or before it is finalized, and every gold version still equals the batch recompute."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pyspark.sql import functions as F

from audit.__main__ import run_audit
from common.lineage import batch_watermark_ms, read_nothing
from gold.tables import gold_tables, query_name

REPO = Path(__file__).resolve().parent.parent
DEMO_N = 20_000          # the Makefile's DEMO_N


def test_an_available_now_run_closes_every_session_and_window_its_final_watermark_passed(spark, env, cfg):
    from pipeline.cli import main

    gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", str(DEMO_N), "--seed", "7"],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr
    assert main([], spark=spark, env=env) == 0

    tables = gold_tables(cfg)
    checkpoint = cfg.checkpoint(query_name(cfg, tables))
    last = max(int(f.name) for f in (Path(checkpoint) / "commits").iterdir() if f.name.isdigit())
    # The run's last batch is the watermark-only one: it read nothing and applied the watermark
    # of every event before it.
    assert read_nothing(checkpoint, last), "the run did not end with a watermark-only batch"
    wm = batch_watermark_ms(checkpoint, last)
    behind = F.timestamp_millis(F.lit(wm))
    read = lambda t: spark.read.format("delta").load(cfg.table_path("gold", t.table))  # noqa: E731

    for t in tables:
        rows = read(t)
        if t.stateful:
            passed = F.col("session_end") + F.expr(f"INTERVAL {t.spec.gap_ms} MILLISECONDS") <= behind
            flag, value = "status", (F.col("status") == "closed")
        else:
            passed, flag, value = F.col("window_end") <= behind, "finalized", F.col("finalized")
        counts = rows.agg(F.count_if(passed).alias("passed"), F.count_if(value).alias("closed"),
                          F.count_if(passed != value).alias("wrong"), F.count(F.lit(1)).alias("rows")).first()
        assert counts["passed"] > 0, f"gold.{t.table}: the final watermark passed no row ({counts})"
        assert counts["wrong"] == 0, (f"gold.{t.table}: {counts['wrong']} rows whose {flag} disagrees with "
                                      f"the final watermark ({counts})")
        assert counts["closed"] == counts["passed"]

    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    for entry in report["tables"]:
        if entry["table"].startswith("gold."):
            statuses = [c["status"] for c in entry["prefix"]]
            assert "FAIL" not in statuses and statuses[-1] == "PASS", (entry["table"], statuses)
