"""bench/refresh.py's reader: row counts from a Delta log and what counts as an empty or partial
table. Tiny tables written by delta-rs; no Spark."""
from __future__ import annotations

import time

import pyarrow as pa
from deltalake import write_deltalake

from bench.refresh import Reader, judge, table_rows, walk


def test_rows_come_from_the_log_at_any_version(tmp_path):
    path = str(tmp_path / "t")
    assert table_rows(path) is None                      # no table yet
    write_deltalake(path, pa.table({"a": [1, 2, 3]}))
    write_deltalake(path, pa.table({"a": [4, 5]}), mode="append")
    assert table_rows(path) == (1, 5)
    write_deltalake(path, pa.table({"a": [9]}), mode="overwrite")
    assert table_rows(path) == (2, 1) and table_rows(path, 0) == (0, 3)


def test_every_version_after_the_one_before_is_counted(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"a": [1, 2]}))
    before = table_rows(path)
    write_deltalake(path, pa.table({"a": [1]}), mode="overwrite")           # partial
    write_deltalake(path, pa.table({"a": [1, 2, 3]}), mode="overwrite")
    assert walk(path, before) == [{"version": 1, "rows": 1, "ok": False}, {"version": 2, "rows": 3, "ok": True}]


def test_a_missing_empty_or_partial_table_is_a_violation_and_a_full_one_is_not():
    samples = [(0.0, 4, 5, None), (0.5, 5, 5, None), (1.0, 6, 6, None)]
    seen = judge(samples, 5, 1.5)
    assert seen["violation_count"] == 0 and seen["bad_s"] == 0 and seen["min_rows"] == 5
    samples = [(0.0, None, None, None), (0.5, 0, 0, None), (1.0, 1, 3, None), (1.5, 2, 7, None), (2.0, 3, 6, None)]
    seen = judge(samples, 5, 2.5)
    assert [v["why"] for v in seen["violations"]] == [
        "no table", "0 rows", "fewer rows than before (5)", "fewer rows than version 2 (7)"]
    assert seen["bad_s"] == 2.0 and seen["versions"] == [0, 3]


def test_the_reader_samples_every_table_until_stopped(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"a": [1, 2]}))
    with Reader({"t": path, "gone": str(tmp_path / "gone")}, every=0.05) as reader:
        time.sleep(0.2)
    assert reader.samples["t"][0][1:] == (0, 2, None) and len(reader.samples["t"]) >= 2
    assert reader.samples["gone"][0][1:] == (None, None, None) and reader.ended >= 0.2
