"""A fresh streaming query over a Delta table whose history is appends only reads the commits
from version 0 (the same rows, no listing of the snapshot); any other history, or a query that
has already started, keeps Delta's default (common/delta_source.py)."""
from __future__ import annotations

import pytest

from common.delta_source import appends_only, delta_stream, start_options
from common.internals import offset_log_entry


def _table(spark, path: str, appends: int = 3, properties: str = "") -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, s STRING) USING delta {properties}")
    for i in range(appends):
        _append(spark, path, i * 10)


def _append(spark, path: str, first: int) -> None:
    spark.range(first, first + 10).selectExpr("id", "CAST(id AS STRING) AS s") \
        .write.format("delta").mode("append").save(path)


def _stream(spark, path: str, checkpoint: str, name: str):
    """Every row, one file per micro-batch: the first batch's offset says where the read began
    (isStartingVersion: in the snapshot, as Delta's source does without an offset)."""
    query = (delta_stream(spark, path, checkpoint, max_files=1).writeStream.format("memory").queryName(name).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return sorted(tuple(r) for r in spark.table(name).collect())


def test_a_fresh_query_on_an_append_only_table_reads_its_commits_with_the_same_rows(spark, tmp_path):
    path, checkpoint = str(tmp_path / "t"), str(tmp_path / "checkpoint")
    _table(spark, path)
    assert start_options(checkpoint, path) == {"startingVersion": "0"}
    rows = _stream(spark, path, checkpoint, "appends_only")
    assert rows == sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
    assert len(rows) == 30
    (offset,) = offset_log_entry(checkpoint, 0)[1]
    assert offset["isStartingVersion"] is False and offset["reservoirVersion"] <= 3, offset
    # Started once, the query goes where its offsets say: no option to give any more.
    assert start_options(checkpoint, path) == {}


HISTORIES = {
    "compacted": lambda spark, path: spark.sql(f"OPTIMIZE delta.`{path}`"),
    "a row deleted": lambda spark, path: spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3"),
    "overwritten": lambda spark, path: spark.range(5).selectExpr("id", "'o' AS s")
        .write.format("delta").mode("overwrite").save(path),
    "a column added": lambda spark, path: spark.range(2).selectExpr("id", "'n' AS s", "1 AS n")
        .write.format("delta").mode("append").option("mergeSchema", "true").save(path),
    "a property set": lambda spark, path: spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 40 days')"),
}


@pytest.mark.parametrize("history", sorted(HISTORIES))
def test_a_table_that_is_not_appends_only_is_read_from_its_snapshot(spark, tmp_path, history):
    path, checkpoint = str(tmp_path / "t"), str(tmp_path / "checkpoint")
    _table(spark, path)
    assert appends_only(path)
    HISTORIES[history](spark, path)
    _append(spark, path, 100)         # two files at least: the first batch stops inside the snapshot
    assert not appends_only(path)
    name = "history_" + "_".join(history.split())
    rows = _stream(spark, path, checkpoint, name)
    assert rows == sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
    (offset,) = offset_log_entry(checkpoint, 0)[1]
    assert offset["isStartingVersion"] is True, offset


def test_a_table_with_a_log_checkpoint_or_no_log_is_read_from_its_snapshot(spark, tmp_path):
    path = str(tmp_path / "t")
    assert not appends_only(path)
    _table(spark, path, appends=3, properties="TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    assert not appends_only(path)     # its first commits may be cleaned up after the checkpoint
    assert start_options(str(tmp_path / "checkpoint"), path) == {}
