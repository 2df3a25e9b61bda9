"""Silver transforms: bronze rows -> camera events or quarantine candidates. Pure DataFrame
functions; the streaming job and the batch tests call the very same ones.

Leaves of the JSON schema are read as strings on purpose: Spark's JSON reader turns a value of
the wrong type into NULL, which would make "has_person": "maybe" look like a missing field.
Reading text and casting here lets every problem get its own reason code.
"""
from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType, StructField, StructType

CORRUPT = "_corrupt_record"
BOOL_FIELDS = ("has_sound", "has_motion", "has_person")
TIME_FIELDS = ("start_time", "end_time")

_LAST_EVENT = StructType([StructField(f, StringType()) for f in (*BOOL_FIELDS, *TIME_FIELDS)])
_CAMERA = StructType([
    StructField("device_id", StringType()),
    StructField("name", StringType()),
    StructField("is_online", StringType()),
    StructField("last_event", _LAST_EVENT),
])
# Only what silver uses: a field outside the schema (metadata, new fields) is never parsed, so
# its type can change without quarantining the record.
NEST_SCHEMA = StructType([
    StructField("devices", StructType([StructField("cameras", MapType(StringType(), _CAMERA))])),
    StructField(CORRUPT, StringType()),
])

# Lineage carried from bronze to silver and quarantine rows.
LINEAGE = {
    "source": "bronze_source", "file_path": "bronze_file_path", "line_number": "bronze_line_number",
    "kafka_topic": "bronze_kafka_topic", "kafka_partition": "bronze_kafka_partition",
    "kafka_offset": "bronze_kafka_offset", "ingest_time": "bronze_ingest_time",
}
LINEAGE_COLUMNS = list(LINEAGE.values())

EVENT_COLUMNS = [
    "event_id", "device_id", "name", "is_online", *BOOL_FIELDS, *TIME_FIELDS,
    "duration_seconds", "event_time",
]
# What parse_events returns: one row per camera event, or one per unparsable record.
PARSED_COLUMNS = ["raw", *LINEAGE_COLUMNS, "parsed", "camera_index", *EVENT_COLUMNS, "reasons"]


def _lineage() -> list[Column]:
    return [F.col(src).alias(dst) for src, dst in LINEAGE.items()]


def _bool(text: Column) -> Column:
    return F.when(F.lower(text) == "true", True).when(F.lower(text) == "false", False)


def _timestamp(text: Column) -> Column:
    # ISO-8601 with Z or offset, 0-6 fraction digits; no zone, a bare number (epoch) or garbage
    # gives NULL -> bad_timestamp.
    return F.try_to_timestamp(text, F.lit("yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX"))


def _reason(condition: Column, code: str) -> Column:
    return F.when(condition, F.lit(code))


def _reasons(*candidates: Column) -> Column:
    return F.filter(F.array(*candidates), lambda c: c.isNotNull())


def parse_records(bronze: DataFrame) -> DataFrame:
    """Parse each bronze record once; add `parsed` (bool) and record-level `reasons`."""
    # A UTF-8 BOM (first line of a file saved by some Windows tools) is not JSON; bronze keeps it,
    # the parser skips it.
    text = F.regexp_replace("raw", "^\ufeff", "")
    j = F.from_json(text, NEST_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    df = bronze.select("raw", *_lineage(), j.alias("j"))
    cameras = F.col("j.devices.cameras")
    # One reason per record, the first that applies. from_json reads the first JSON value and
    # ignores what follows it, so content after the closing brace is checked here: an object
    # must end the line, and "}{" (outside a string) means a second value follows.
    reason = (F.when(F.col("raw").isNull() | F.col("raw").rlike(r"^\s*$"), "empty_record")
              .when(~F.is_valid_utf8("raw"), "invalid_utf8")
              .when(F.col("j").isNull() | ~text.rlike(r"\}\s*$"), "malformed_json")
              .when(text.rlike(r"\}\s*\{") & (F.coalesce(F.json_array_length(
                  F.concat(F.lit("["), text, F.lit("]"))), F.lit(0)) != 1), "malformed_json")
              .when(F.col(f"j.{CORRUPT}").isNotNull(), _shape_reason(text))
              .when(cameras.isNull() | (F.size(cameras) == 0), "missing_cameras"))
    return df.withColumn("reasons", _reasons(reason)).withColumn("parsed", F.size("reasons") == 0)


def _shape_reason(text: Column) -> Column:
    """Why valid JSON did not fit NEST_SCHEMA: the first container that is not an object
    (wrong_type:devices|cameras|camera|last_event), else malformed_json. Each level is read as
    text (Spark keeps any JSON value as its text in a string field); evaluated only for the
    records the schema rejected."""
    def not_object(c: Column) -> Column:
        return c.isNotNull() & ~c.startswith("{")

    devices = F.from_json(text, "devices STRING")["devices"]
    cameras = F.from_json(devices, "cameras STRING")["cameras"]
    each = F.map_values(F.from_json(cameras, MapType(StringType(), StringType())))
    last_events = F.transform(each, lambda c: F.from_json(c, "last_event STRING")["last_event"])
    return (F.when(not_object(devices), "wrong_type:devices")
            .when(not_object(cameras), "wrong_type:cameras")
            .when(F.exists(each, not_object), "wrong_type:camera")
            .when(F.exists(last_events, not_object), "wrong_type:last_event")
            .otherwise("malformed_json"))


def explode_events(records: DataFrame, min_event_time: datetime, max_future_seconds: float) -> DataFrame:
    """Records -> one row per camera, flattened and typed, with event-level reasons. A record
    that did not parse stays one row (camera fields NULL) with its record-level reasons; doing
    both in one pass reads the source once (a union of two branches would scan it twice)."""
    exploded = records.select(
        "raw", *LINEAGE_COLUMNS, "parsed", F.col("reasons").alias("record_reasons"),
        F.posexplode_outer(F.when(F.col("parsed"), F.col("j.devices.cameras")))
        .alias("camera_index", "camera_key", "cam"))
    le = F.col("cam.last_event")
    typed = exploded.select(
        "raw", *LINEAGE_COLUMNS, "parsed", "record_reasons", "camera_index",
        F.col("cam.device_id").alias("device_id"),
        F.col("cam.name").alias("name"),
        _bool(F.col("cam.is_online")).alias("is_online"),
        F.col("cam.is_online").alias("_is_online_text"),
        F.col("camera_key"),
        *[_bool(le[f]).alias(f) for f in BOOL_FIELDS],
        *[_timestamp(le[f]).alias(f) for f in TIME_FIELDS],
        *[le[f].alias(f"_{f}_text") for f in (*BOOL_FIELDS, *TIME_FIELDS)],
        F.col("cam.last_event").isNull().alias("_no_last_event"),
    )
    earliest = F.lit(min_event_time)
    latest = F.col("bronze_ingest_time") + F.make_dt_interval(secs=F.lit(max_future_seconds))
    field_reasons = []
    for f in (*BOOL_FIELDS, *TIME_FIELDS):
        text = F.col(f"_{f}_text")
        bad = "wrong_type" if f in BOOL_FIELDS else "bad_timestamp"
        field_reasons += [_reason(~F.col("_no_last_event") & text.isNull(), f"missing_field:{f}"),
                          _reason(text.isNotNull() & F.col(f).isNull(), f"{bad}:{f}")]
    event_reasons = _reasons(
        _reason(F.col("device_id").isNull() | (F.trim("device_id") == ""), "missing_field:device_id"),
        _reason((F.trim("device_id") != "") & (F.col("camera_key") != F.col("device_id")),
                "device_id_mismatch"),
        _reason(F.col("_is_online_text").isNotNull() & F.col("is_online").isNull(), "wrong_type:is_online"),
        _reason(F.col("_no_last_event"), "missing_field:last_event"),
        *field_reasons,
        _reason((F.col("start_time") < earliest) | (F.col("start_time") > latest),
                "time_out_of_range:start_time"),
    )
    reasons = F.when(F.col("parsed"), event_reasons).otherwise(F.col("record_reasons"))
    return (typed.withColumn("reasons", reasons)
            .withColumn("event_id", F.when(F.col("parsed"), _event_id()))
            .withColumn("duration_seconds",
                        F.col("end_time").cast("double") - F.col("start_time").cast("double"))
            .withColumn("event_time", F.col("start_time"))
            .select(*PARSED_COLUMNS))


def _event_id() -> Column:
    """Stable identity of a camera event: the same device, start and end always hash the same,
    whichever record, file or Kafka message carried it."""
    fmt = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
    return F.sha2(F.concat_ws("|", F.col("device_id"), F.date_format("start_time", fmt),
                              F.date_format("end_time", fmt)), 256)


def parse_events(bronze: DataFrame, min_event_time: datetime, max_future_seconds: float) -> DataFrame:
    """bronze.events rows -> events (reasons empty) and rejects (reasons set), one DataFrame."""
    return explode_events(parse_records(bronze), min_event_time, max_future_seconds)


def accepted(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.size("reasons") == 0)


def rejected(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.size("reasons") > 0)


def deduplicate(parsed: DataFrame, delay: str) -> DataFrame:
    """Drop repeats of an event_id seen within `delay` of event time.

    In a stream, RocksDB state carries the ids across micro-batches, and accepted events older
    than the watermark are dropped (Spark counts them as numRowsDroppedByWatermark). Rejected
    rows ride along untouched: their event_time is NULL (never late, never moves the
    watermark) and their key is their own bronze position (never a duplicate), so one query
    carries both and each batch's counts add up.
    """
    ok = F.size("reasons") == 0
    reject_key = F.concat_ws("|", F.lit("reject"), "bronze_source", "bronze_file_path",
                             "bronze_line_number", "bronze_kafka_topic", "bronze_kafka_partition",
                             "bronze_kafka_offset", F.coalesce(F.col("camera_index"), F.lit(-1)))
    keyed = (parsed.withColumn("event_time", F.when(ok, F.col("event_time")))
             .withColumn("dedup_key", F.when(ok, F.col("event_id")).otherwise(reject_key)))
    if not keyed.isStreaming:
        # Spark rejects dropDuplicatesWithinWatermark on a static DataFrame; a static batch is
        # all inside one watermark, so a plain dropDuplicates is the same operation there.
        return keyed.dropDuplicates(["dedup_key"]).drop("dedup_key")
    return (keyed.withWatermark("event_time", delay)
            .dropDuplicatesWithinWatermark(["dedup_key"]).drop("dedup_key"))


def input_metrics(parsed: DataFrame) -> list[Column]:
    """Counts of a batch before dedup, in both units: each parsed record has exactly one row
    with camera_index 0; each unparsed record is one row with parsed = false."""
    return [F.count(F.when(F.col("camera_index") == 0, 1)).alias("records_parsed"),
            F.count(F.when(~F.col("parsed"), 1)).alias("records_quarantined_unparsed"),
            F.count(F.when(F.col("parsed"), 1)).alias("events_parsed")]


def join_locations(events: DataFrame, locations: DataFrame) -> DataFrame:
    """Attach zip/city/state; an unknown device is kept with NULL zip and unknown_device=true.

    The flag comes from the join match, not from a NULL zip, so a known device whose reference
    row lacks a zip code stays distinguishable (gold's quality gate checks exactly that)."""
    loc = locations.select("device_id", "zip_code", "city", "state", F.lit(True).alias("_known"))
    return (events.join(F.broadcast(loc), "device_id", "left")
            .withColumn("unknown_device", F.col("_known").isNull()).drop("_known"))


def to_silver(events: DataFrame, batch_id: int) -> DataFrame:
    return events.select(
        "event_id", "device_id", "name", "is_online", *BOOL_FIELDS, *TIME_FIELDS, "duration_seconds",
        "event_time", F.to_date("event_time").alias("event_date"),
        "zip_code", "city", "state", "unknown_device", *LINEAGE_COLUMNS,
        F.lit(batch_id).cast("long").alias("silver_batch_id"),
    )


def to_quarantine(rows: DataFrame, batch_id: int) -> DataFrame:
    return rows.select(
        "raw", "reasons", "event_id", "device_id", *LINEAGE_COLUMNS,
        F.lit(batch_id).cast("long").alias("batch_id"),
        F.current_timestamp().alias("quarantined_at"),
    )
