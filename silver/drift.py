"""The schema contract's side of a silver batch: which undeclared keys the batch met, the error
when the contract says fail, the columns silver grows by when it says evolve, the counts the
accounting books and the rows of ops.new_fields. silver/contract.py computes the per-event
columns these read; SilverBatch calls these only for a batch in which some event has one.
"""
from __future__ import annotations

from datetime import datetime, timezone

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from common.errors import JobError
from common.profile import Profile
from common.spec import NAME
from silver import contract as C
from silver import transform as T


class ContractError(JobError):
    """A key the profile does not declare, at a level whose contract is `fail`. The batch
    commits nothing; declare the field, or change the contract, and run again."""


def metrics(accepted: Column) -> list[Column]:
    """Aggregates over a batch's rows (beside silver's other counts, in the same pass): events
    to be written with rescued data, their rescued keys, and events with any undeclared key."""
    rescued = F.col(C.RESCUED)
    any_key = rescued.isNotNull() | F.col(C.EVOLVED).isNotNull() | F.col(C.VIOLATIONS).isNotNull()
    return [F.count(F.when(accepted & rescued.isNotNull(), 1)).alias("events_rescued"),
            F.coalesce(F.sum(F.when(accepted & rescued.isNotNull(), F.size(rescued))), F.lit(0))
            .alias("fields_rescued"),
            F.count(F.when(F.col("parsed") & any_key, 1)).alias("events_drifted")]


def rescued_counts(rows: DataFrame) -> tuple[int, int]:
    r = rows.agg(*metrics(F.lit(True))[:2]).first()
    return int(r[0]), int(r[1])


def seen(rows: DataFrame, profile: Profile) -> list[dict]:
    """Each undeclared key the batch's parsed events carry, by contract mode: how many records
    and events carried it and the first bronze record that did. One job over the cached batch,
    on its drifted rows only."""
    position = F.struct(*[F.col(c) for c in ("bronze_file_path", "bronze_line_number", "bronze_kafka_topic",
                                            "bronze_kafka_partition", "bronze_kafka_offset")])
    parts = [rows.where(F.col("parsed") & F.col(column).isNotNull())
             .select(F.explode(F.map_keys(column)).alias("field"), F.lit(mode).alias("mode"),
                     T.bronze_key("bronze_").alias("record"), position.alias("position"))
             for mode, column in C.BY_MODE.items()]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    found = (union.groupBy("field", "mode")
             .agg(F.count_distinct("record").alias("records"), F.count(F.lit(1)).alias("events"),
                  F.min("position").alias("first")).collect())
    return [{"field": r.field, "mode": r.mode, "level": level(profile, r.field), "records": r.records,
             "events": r.events, "first_at": where(r.first)} for r in sorted(found, key=lambda r: r.field)]


def level(profile: Profile, path: str) -> str:
    if path in {".".join(f.path) for f in profile.fields}:
        return "wrong_type"               # a declared field's value the contract rescued
    return C.level_of(profile, path)


def where(position) -> str:
    """A bronze record's position, as an operator finds it: file and line, or Kafka offset."""
    if position.bronze_file_path is not None:
        return f"{position.bronze_file_path} line {position.bronze_line_number}"
    return (f"Kafka {position.bronze_kafka_topic} partition {position.bronze_kafka_partition} "
            f"offset {position.bronze_kafka_offset}")


def check(found: list[dict], profile: Profile, batch_id: int) -> None:
    """Raise ContractError naming each key whose level's contract is fail (nothing committed)."""
    failed = [f for f in found if f["mode"] == "fail"]
    if failed:
        named = "; ".join(f"'{f['field']}' ({f['level']} level, {f['records']} records, first in {f['first_at']})"
                          for f in failed)
        raise ContractError(f"silver batch {batch_id}: profile {profile.name} does not declare {named}, and its "
                            f"contract says fail at that level: declare the field in {profile.file} or set "
                            f"parse.contract to rescue or evolve; nothing of the batch was written")


def evolution(found: list[dict], profile: Profile, have: set[str]) -> tuple[tuple, tuple]:
    """(path, column) of each evolved key that can become a column, and the paths that cannot
    (not a column name once its dots are underscores, or a name silver already uses for a
    declared column, or two keys of the batch wanting one name): those are rescued instead.
    `have`: silver's own columns, lower case (Delta's names are case-insensitive)."""
    wanted = [(f["field"], C.evolved_column(f["field"])) for f in found if f["mode"] == "evolve"]
    names = [c.lower() for _, c in wanted]
    ok = [(p, c) for p, c in wanted if NAME.match(c) and c.lower() not in have and names.count(c.lower()) == 1]
    kept = {p for p, _ in ok}
    return tuple(ok), tuple(p for p, _ in wanted if p not in kept)


def rescue_instead(rows: DataFrame, paths: tuple) -> DataFrame:
    """Move evolved keys that cannot be columns into the rescued data."""
    keys = F.array(*[F.lit(p) for p in paths])
    moved = F.map_filter(F.col(C.EVOLVED), lambda k, _: F.array_contains(keys, k))
    both = F.map_concat(F.coalesce(F.col(C.RESCUED), F.create_map().cast(C.VALUES)),
                        F.coalesce(moved, F.create_map().cast(C.VALUES)))
    return rows.withColumn(C.RESCUED, F.when(F.size(both) > 0, both))


def columns(evolved: tuple) -> StructType:
    return StructType([StructField(column, StringType()) for _, column in evolved])


def rows(found: list[dict], evolved: tuple, moved: tuple, query: str, batch_id: int) -> list[tuple]:
    """ops.new_fields rows of the batch (schemas.NEW_FIELDS order)."""
    at, to_column = datetime.now(timezone.utc), dict(evolved)
    out = []
    for f in found:
        mode = "rescue" if f["field"] in moved else f["mode"]
        out.append((query, batch_id, f["field"], f["level"], mode, to_column.get(f["field"]),
                    f["records"], f["events"], f["first_at"], at))
    return out
