"""A run killed while a query logged its first batch, or while it created a table, must not
leave the pipeline unable to start."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.streaming import clear_interrupted_first_batch


def _run(spark, source, checkpoint):
    q = (spark.readStream.text(str(source)).writeStream.format("noop")
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    q.awaitTermination()


def test_a_first_batch_killed_while_being_logged_is_cleared_and_the_query_starts(spark, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    (source / "a.txt").write_text("one\ntwo\n")
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True)
    # What a kill between writing the entry's temporary file and renaming it leaves.
    (offsets / ".0.0b9a4c1e-tmp-entry.tmp").write_text('v1\n{"batchWatermarkMs":0}\n')
    (offsets / "..0.0b9a4c1e-tmp-entry.tmp.crc").write_bytes(b"crc")

    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        _run(spark, source, checkpoint)      # Spark alone refuses the checkpoint for good

    assert sorted(clear_interrupted_first_batch(str(checkpoint))) == [
        "..0.0b9a4c1e-tmp-entry.tmp.crc", ".0.0b9a4c1e-tmp-entry.tmp"]
    _run(spark, source, checkpoint)
    assert (offsets / "0").is_file() and (checkpoint / "commits" / "0").is_file()

    # Once a batch is logged, the offset log is Spark's: nothing is removed.
    stray = offsets / ".1.f00.tmp"
    stray.write_text("partial")
    assert clear_interrupted_first_batch(str(checkpoint)) == []
    assert stray.exists()
    assert clear_interrupted_first_batch(str(tmp_path / "never-started")) == []


def test_a_table_killed_while_being_created_is_no_table_and_is_created_again(spark, cfg):
    from delta.tables import DeltaTable

    from common.catalog import existing_tables, register_tables
    from common.delta import ensure_table
    from common.schemas import DQ_RESULTS
    from common.storage import is_delta_table
    from silver.locations import ensure_seeded

    dim = cfg.profile.dimension.table
    table = cfg.table_path("silver", dim)
    # What a kill -9 during the dimension's first commit left (seen in make chaos): Delta's log
    # folder with its staging folder and a commit still in its temporary file, no commit.
    log = Path(table) / "_delta_log"
    (log / "_staged_commits").mkdir(parents=True)
    (log / ".00000000000000000000.json.5e1d7c2a.tmp").write_text("{}")
    assert not is_delta_table(table)
    # Every process registers the tables on disk as its session starts: this one used to fail
    # every restart with DELTA_CREATE_EXTERNAL_TABLE_WITHOUT_TXN_LOG.
    register_tables(spark, cfg)
    assert ("silver", dim, table) not in existing_tables(cfg)

    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text("device_id,zip_code,city,state\ncam-1,02108,Boston,MA\ncam-2,94105,SF,CA\n")
    ensure_seeded(spark, cfg)
    assert is_delta_table(table) and ("silver", dim, table) in existing_tables(cfg)
    assert spark.table(f"silver.{dim}").count() == 2

    # A table created empty first (every other one) refused its creation there for good
    # (DELTA_TABLE_NOT_FOUND, seen in CI's chaos run): the commitless log goes, the table comes.
    dq = cfg.table_path("ops", "dq_results")
    (Path(dq) / "_delta_log" / "_staged_commits").mkdir(parents=True)
    ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS)
    assert is_delta_table(dq) and spark.table("ops.dq_results").schema == DQ_RESULTS
    history = DeltaTable.forPath(spark, dq).history().collect()
    assert [h.operation for h in history] == ["CREATE TABLE"]
