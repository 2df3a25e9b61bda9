"""A record's bytes as bronze and quarantine keep them: byte for byte, in types every Delta reader
accepts.

Parquet and Delta define a string as UTF-8, and delta-rs, DuckDB and pandas refuse a table whose
string column holds anything else (Spark alone does not check). So the bytes live in one of two
columns: `raw` (STRING) when they are valid UTF-8, which is nearly always and reads as text
everywhere; `raw_bytes` (BINARY) when they are not, with `raw` NULL. Both NULL: the record had
no bytes at all (a Kafka message with a null value). `as_binary` gives the bytes back from
either, which is what byte-exactness is checked against.
"""
from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

RAW, RAW_BYTES = "raw", "raw_bytes"
# A Kafka message's key is kept the same way.
KEY, KEY_BYTES = "kafka_key", "kafka_key_bytes"
# Each text column -> the binary column that holds its bytes when they are not UTF-8.
PAIRS = {RAW: RAW_BYTES, KEY: KEY_BYTES}


def split(value: Column, text: str = RAW) -> tuple[Column, Column]:
    """BINARY bytes -> (text, its binary column), exactly one of them set (neither for NULL). A
    cast of binary to string keeps the bytes as they are; the UTF-8 check decides which column
    holds them."""
    as_text = value.cast("string")
    valid = F.is_valid_utf8(as_text)
    return F.when(valid, as_text).alias(text), F.when(~valid, value).alias(PAIRS[text])


def as_binary(raw: str = RAW, raw_bytes: str = RAW_BYTES) -> Column:
    """The record's bytes, whichever column holds them."""
    return F.coalesce(F.col(raw).cast("binary"), F.col(raw_bytes))


def migrate(spark, path: str, added: list[str], commit_info: dict) -> list[str]:
    """Move the bytes of rows written before a binary column of PAIRS existed (invalid UTF-8 in
    its text column) into it: one UPDATE per column, which rewrites only the files holding such
    rows. Run once, by the process that holds the table's writers, right after it added the
    columns (common.delta.ensure_table). Returns the text columns it migrated."""
    from common.delta import commit_metadata

    done = []
    for text, binary in PAIRS.items():
        if binary in added:
            with commit_metadata(spark, {**commit_info, "migration": binary}):
                spark.sql(f"UPDATE delta.`{path}` SET {binary} = CAST({text} AS BINARY), {text} = NULL "
                          f"WHERE {text} IS NOT NULL AND NOT is_valid_utf8({text})")
            done.append(text)
    return done
