"""Silver transforms: bronze rows -> events or quarantine candidates, as the source profile
(common/profile.py) declares them. Pure DataFrame functions; the streaming job and the batch
tests call the very same ones. Without a profile argument they use the nest profile.

Leaves of the JSON schema are read as strings on purpose: Spark's JSON reader turns a value of
the wrong type into NULL, which would make "has_person": "maybe" look like a missing field.
Reading text and casting here lets every problem get its own reason code.
"""
from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, DateType, MapType, NumericType, StringType, StructField, StructType,
                               TimestampNTZType, TimestampType, _parse_datatype_string)

from common import raw_bytes
from common.profile import Profile
from silver import contract as C

CORRUPT = "_corrupt_record"
BOM = "\ufeff"


def raw_schema(profile: Profile) -> StructType:
    """The record's JSON schema, leaves as text, plus the corrupt-record column. Declared in the
    profile, or derived from the explode path and the field paths."""
    if profile.schema:
        schema = _parse_datatype_string(profile.schema)
    else:
        element = StructType()
        for f in profile.fields:
            _add_path(element, f.path)
        schema = element
        if profile.explode_path:
            schema = StructType()
            _add_path(schema, profile.explode_path, ArrayType(element))
    return StructType(schema.fields + [StructField(CORRUPT, StringType())])


def _add_path(struct: StructType, path: tuple[str, ...], leaf_type=None) -> None:
    head, rest = path[0], path[1:]
    existing = next((f for f in struct.fields if f.name == head), None)
    if not rest:
        if existing is None:
            struct.add(head, leaf_type or StringType())
        return
    if existing is None:
        struct.add(head, StructType())
        existing = struct.fields[-1]
    _add_path(existing.dataType, rest, leaf_type)


# Lineage carried from bronze to silver and quarantine rows.
LINEAGE = {
    "source": "bronze_source", "file_path": "bronze_file_path", "line_number": "bronze_line_number",
    "kafka_topic": "bronze_kafka_topic", "kafka_partition": "bronze_kafka_partition",
    "kafka_offset": "bronze_kafka_offset", "ingest_time": "bronze_ingest_time",
}
LINEAGE_COLUMNS = list(LINEAGE.values())



def event_columns(profile: Profile) -> list[str]:
    return ["event_id", *profile.outputs, *(name for name, _ in profile.derived), "event_time"]


# The record's bytes (common/raw_bytes.py). Silver carries them on the row of a record it could
# not parse, and on the rejected events of a record small enough that copying it onto each of its
# elements costs little (carry_bytes: its size x its elements); every other event carries only its
# bronze position (LINEAGE), from which a quarantined event's record is fetched once
# (with_record_bytes). Carried on every event, a record of 20,000 elements was copied 20,000
# times; fetched for every rejected event, the fetch read the raw column of every bronze file of
# the batch's range again.
RAW_COLUMNS = [raw_bytes.RAW, raw_bytes.RAW_BYTES]


def parsed_columns(profile: Profile) -> list[str]:
    """What parse_events returns: one row per event, or one per unparsable record."""
    return [*RAW_COLUMNS, *LINEAGE_COLUMNS, "parsed", profile.index, *event_columns(profile), "reasons",
            *C.BY_MODE.values()]


def _lineage() -> list[Column]:
    return [F.col(src).alias(dst) for src, dst in LINEAGE.items()]


# Spark 4's lower() and upper() map case through ICU, and their first call in a JVM loads ICU's
# tables and break rules, which plain Spark's casts never pay: a fresh run-all's silver batch of
# 20,000 events took 6.6-7.0 s with them, 4.8-5.2 s without (one row in an odd case is enough).
# translate() of the few letters compared gives the same answer without ICU: no character but
# these ASCII ones lower-cases to t, r, u, e, f, a, l or s, or upper-cases to T or Z (a test checks
# every code point). The usual spelling is matched first, as it is.
def _bool(text: Column) -> Column:
    folded = F.translate(text, "TRUEFALS", "truefals")
    return (F.when(text == "true", True).when(text == "false", False)
            .when(folded == "true", True).when(folded == "false", False))


# What a timestamp field (format: iso) accepts: ISO-8601 with Z or an offset and 0-6 fraction
# digits; no zone, a bare number (epoch) or garbage gives NULL -> bad_timestamp.
ISO_PATTERN = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX"
# Text of ISO_PATTERN's usual shape, which a cast (Spark's own parser, after upper-casing the T
# and Z this pattern also takes in lower case) reads to the same instant or to NULL as the
# pattern does (tests/test_silver_transform.py checks 60,000 such texts drawn near every part's
# edges). The pattern's DateTimeFormatter was 13% of silver's parse CPU; every other text
# (signed years, garbage) still goes through it. `\z`, not `$`: `$` would take a trailing newline.
ISO_SHAPE = r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2})\z"
# The same shape already in upper case, the usual one: cast as it is (see _bool on upper()).
ISO_SHAPE_UPPER = ISO_SHAPE.replace("[Tt]", "T").replace("[Zz]", "Z")


def _timestamp(text: Column) -> Column:
    return (F.when(text.rlike(ISO_SHAPE_UPPER), text.try_cast("timestamp"))
            .when(text.rlike(ISO_SHAPE), F.translate(text, "tz", "TZ").try_cast("timestamp"))
            .otherwise(F.try_to_timestamp(text, F.lit(ISO_PATTERN))))


def _reason(condition: Column, code: str) -> Column:
    return F.when(condition, F.lit(code))


def _reasons(*candidates: Column) -> Column:
    """The codes that apply, in order. Concatenated arrays rather than filter(array(...)): a
    higher-order function is evaluated row by row outside generated code, and so would every
    check under it be (is_valid_utf8 through reflection), on every record and event."""
    none = F.array().cast("array<string>")
    each = [F.when(c.isNull(), none).otherwise(F.array(c)) for c in candidates]
    return F.concat(*each).cast("array<string>")   # elements nullable, as the tables declare


def _at(column: Column, path: tuple[str, ...]) -> Column:
    for part in path:
        column = column.getField(part)
    return column


def _elements_name(profile: Profile) -> str:
    return profile.explode_path[-1] if profile.explode_path else "record"


def parse_records(bronze: DataFrame, profile: Profile, max_record_bytes: int | None = None) -> DataFrame:
    """Parse each bronze record once; add `parsed` (bool) and record-level `reasons`. A record
    longer than `max_record_bytes` is not parsed at all (record_too_large)."""
    raw, binary = F.col(raw_bytes.RAW), F.col(raw_bytes.RAW_BYTES)
    text, too_large = _text(max_record_bytes)
    j = F.from_json(F.when(~too_large, text), raw_schema(profile),
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    # The contract's second read (silver/contract.py), only when it looks for undeclared keys.
    extra = []
    if C.active(profile):
        readable = F.when(~too_large, text)
        scanned = C.may_have_undeclared(readable, profile, bronze.sparkSession)
        if scanned is not None:
            readable = F.when(scanned, readable)
        extra.append(F.from_json(readable, C.keys_schema(profile, explodes_map(profile))).alias(C.KEYS))
        top = C.record_extra(readable, profile)
        if top is not None:
            extra.append(top.alias(C.RECORD_EXTRA))
    df = bronze.select(*RAW_COLUMNS, *_lineage(), j.alias("j"), *extra)
    # One reason per record, the first that applies. from_json reads the first JSON value and
    # ignores what follows it, so content after the closing brace is checked here: an object
    # must end the record, and "}{" (outside a string) means a second value follows.
    # Byte tests first (a line opening with "{" is not blank; one closing with "}" ends an
    # object): the regexes decide only the lines those cannot, with the same answers.
    blank = ~raw.startswith("{") & raw.rlike(r"^\s*$")
    ends_object = raw.endswith("}") | text.rlike(r"\}\s*$")
    reason = (F.when((raw.isNull() & binary.isNull()) | blank, "empty_record")
              .when(too_large, "record_too_large")
              .when(binary.isNotNull(), "invalid_utf8")
              .when(F.col("j").isNull() | ~ends_object, "malformed_json")
              .when(text.rlike(r"\}\s*\{") & (F.coalesce(F.json_array_length(
                  F.concat(F.lit("["), text, F.lit("]"))), F.lit(0)) != 1), "malformed_json")
              .when(F.col(f"j.{CORRUPT}").isNotNull(), _shape_reason(text, profile)))
    if profile.explode_path:
        elements = _at(F.col("j"), profile.explode_path)
        reason = reason.when(elements.isNull() | (F.size(elements) == 0),
                             f"missing_{_elements_name(profile)}")
    return df.withColumn("reasons", _reasons(reason)).withColumn("parsed", F.size("reasons") == 0)


def _text(max_record_bytes: int | None) -> tuple[Column, Column]:
    """(the record's JSON text, whether it is over the size limit and so never parsed)."""
    raw, binary = F.col(raw_bytes.RAW), F.col(raw_bytes.RAW_BYTES)
    size = F.coalesce(F.octet_length(raw), F.octet_length(binary))
    too_large = (size > max_record_bytes) if max_record_bytes else F.lit(False)
    # A UTF-8 BOM (first line of a file saved by some Windows tools) is not JSON; bronze keeps it,
    # the parser skips it. The regex runs only where the bytes are there: on every record it cost
    # a decode, a scan and an encode of the whole line.
    return F.when(raw.startswith(BOM), F.regexp_replace(raw, f"^{BOM}", "")).otherwise(raw), too_large


def may_hold_late(profile: Profile, watermark_ms: int, max_record_bytes: int | None = None) -> Column:
    """Whether a bronze record may hold an event at or before `watermark_ms` of event time, judged
    by its elements' event-time field alone, read at the path and with the type parse_events reads
    it by: true for every record that holds such an accepted event (and for some that hold none,
    which parse_events then rejects). Silver reads a batch again for the events its deduplication
    dropped as late, a few hundred among 100,000s: it parses in full only the records this lets
    through, where parsing every record doubled a heavy batch's parse."""
    field = next(f for f in profile.fields if f.name == profile.event_time)
    path = (*(profile.explode_path or ()), *field.path)
    text, too_large = _text(max_record_bytes)
    j = F.from_json(F.when(~too_large, text), _only(raw_schema(profile), path))
    elements = _at(j, profile.explode_path) if profile.explode_path else F.array(j)
    if explodes_map(profile):
        elements = F.map_values(elements)
    bound = F.timestamp_millis(F.lit(watermark_ms))
    return F.exists(elements, lambda e: _typed(_at(e, field.path), field) <= bound)   # NULL: not let through


def _only(dtype, path: tuple[str, ...]):
    """`dtype` with only the fields on `path` (maps and arrays on the way kept as they are)."""
    if isinstance(dtype, MapType):
        return MapType(dtype.keyType, _only(dtype.valueType, path))
    if isinstance(dtype, ArrayType):
        return ArrayType(_only(dtype.elementType, path))
    if not path:
        return dtype
    return StructType([StructField(path[0], _only(dtype[path[0]].dataType, path[1:]))])


def _element_singular(profile: Profile) -> str:
    # nest: index camera_index -> "camera"; a profile without "_index" keeps the index name.
    return profile.index[:-len("_index")] if profile.index.endswith("_index") else profile.index


def explodes_map(profile: Profile) -> bool:
    """Whether the profile's explode path ends at a map (one event per entry) rather than an array."""
    dtype = raw_schema(profile)
    for part in profile.explode_path or ():
        dtype = dtype[part].dataType
    return isinstance(dtype, MapType)


def _shape_reason(text: Column, profile: Profile) -> Column:
    """Why valid JSON did not fit the profile's schema: the first container on the explode path,
    element, or field parent (nest: devices, cameras, camera, last_event) that is not an object,
    as wrong_type:<name>; else malformed_json. Each level is read as text (Spark keeps any JSON
    value as its text in a string field); evaluated only for the records the schema rejected."""
    def not_object(c: Column) -> Column:
        return c.isNotNull() & ~F.ltrim(c).startswith("{")

    def child(c: Column, name: str) -> Column:
        return F.from_json(c, StructType([StructField(name, StringType())]))[name]

    checks = []
    level = text
    path = profile.explode_path or ()
    for i, part in enumerate(path):
        level = child(level, part)
        if i < len(path) - 1 or explodes_map(profile):
            checks.append((not_object(level), f"wrong_type:{part}"))
        else:
            checks.append((level.isNotNull() & ~F.ltrim(level).startswith("["), f"wrong_type:{part}"))
    if path:
        each = (F.map_values(F.from_json(level, MapType(StringType(), StringType())))
                if explodes_map(profile) else F.from_json(level, ArrayType(StringType())))
        checks.append((F.exists(each, not_object), f"wrong_type:{_element_singular(profile)}"))
    else:
        each = F.array(text)
    parents = list(dict.fromkeys(f.path[:k] for f in profile.fields for k in range(1, len(f.path))))
    def walker(parent: tuple[str, ...]):
        # One-argument lambda: Spark reads a second parameter as the element's index.
        def walk(c: Column) -> Column:
            for name in parent:
                c = child(c, name)
            return c
        return walk

    for parent in parents:
        checks.append((F.exists(F.transform(each, walker(parent)), not_object),
                       f"wrong_type:{'.'.join(parent)}"))
    out = F.when(F.lit(False), F.lit(None))
    for condition, code in checks:
        out = out.when(condition, code)
    return out.otherwise("malformed_json")


def _typed(text: Column, field) -> Column:
    if field.type == "boolean":
        return _bool(text)
    if field.type in ("long", "double"):
        return text.try_cast(field.type)
    if field.type == "timestamp":
        if field.format == "epoch_seconds":
            return F.timestamp_seconds(text.try_cast("double"))
        if field.format == "epoch_millis":
            return F.timestamp_millis(text.try_cast("long"))
        return _timestamp(text)
    return text   # string, json (an object or array arrives as its JSON text)


def explode_events(records: DataFrame, min_event_time: datetime, max_future_seconds: float,
                   profile: Profile, carry_bytes: int = 0) -> DataFrame:
    """Records -> one row per element (a map entry, an array item, or the record itself),
    flattened and typed, with event-level reasons. A record that did not parse stays one row
    (fields NULL) with its record-level reasons; doing both in one pass reads the source once
    (a union of two branches would scan it twice). `carry_bytes`: a parsed record whose size
    times its number of elements is at most this keeps its bytes on its rejected events (see
    RAW_COLUMNS); 0, on none."""
    idx = profile.index
    elements = _at(F.col("j"), profile.explode_path) if profile.explode_path else F.array(F.col("j"))
    keep = ~F.col("parsed")
    if carry_bytes:
        # (as a long: a record of 45 MB and 20,000 elements overflows an int)
        copied = F.octet_length(raw_bytes.RAW).cast("long") * F.size(elements)
        keep = keep | (copied <= F.lit(carry_bytes))
    is_map = False
    if profile.explode_path:
        dtype = records.schema["j"].dataType
        for part in profile.explode_path:
            dtype = dtype[part].dataType
        is_map = isinstance(dtype, MapType)
    parts = (idx, "_element_key", "_el") if is_map else (idx, "_el")
    contract = C.active(profile)
    if contract:
        # Each element beside its map (the contract's second read), zipped so that neither
        # record's collection is copied onto its elements' rows.
        maps = _at(F.col(C.KEYS), profile.explode_path) if profile.explode_path else F.array(F.col(C.KEYS))
        # A record without an undeclared key was not read again: its elements zip with an empty
        # array, i.e. with NULL maps (arrays_zip pads the shorter; a NULL array would void it).
        none = F.array().cast(ArrayType(C.VALUES))
        # Aliases name the zipped fields (a cast to named fields needed the element's type).
        if is_map:
            elements = F.arrays_zip(F.map_keys(elements).alias("_element_key"),
                                    F.map_values(elements).alias("_el"),
                                    F.coalesce(F.map_values(maps), none).alias(C.ELEMENT_MAP))
        else:
            elements = F.arrays_zip(elements.alias("_el"), F.coalesce(maps, none).alias(C.ELEMENT_MAP))
        parts = (idx, "_z")
    carried = [C.RECORD_EXTRA] if contract and C.RECORD_EXTRA in records.columns else []
    # In a projection of their own, before the explode: computed in the explode's select, Spark
    # would evaluate them after it, on every element's row, and the generator would still copy
    # the record's bytes onto each one.
    records = records.withColumns({c: F.when(keep, F.col(c)) for c in RAW_COLUMNS})
    exploded = records.select(
        *RAW_COLUMNS, *LINEAGE_COLUMNS, "parsed", F.col("reasons").alias("record_reasons"), *carried,
        F.posexplode_outer(F.when(F.col("parsed"), elements)).alias(*parts))
    if contract:
        exploded = exploded.select("*", "_z.*").drop("_z")
    el = F.col("_el")
    outputs = [f for f in profile.fields if f.type != "present"]
    typed = exploded.select(
        *RAW_COLUMNS, *LINEAGE_COLUMNS, "parsed", "record_reasons", idx,
        *(["_element_key"] if is_map else []), *carried, *([C.ELEMENT_MAP] if contract else []),
        *[_typed(_at(el, f.path), f).alias(f.name) for f in outputs],
        *[_at(el, f.path).alias(f"_{f.name}_text") for f in profile.fields],
    )
    absent = [f for f in profile.fields if f.type == "present" and f.required]
    field_reasons, wrong_types = [], []
    rescue_wrong = contract and profile.contract.wrong_type == "rescue"
    for f in profile.fields:
        text = F.col(f"_{f.name}_text")
        if f.required:
            missing = text.isNull() | (F.trim(text) == "") if f.type == "string" else text.isNull()
            # A field inside a required parent that is missing is not reported again.
            for parent in absent:
                if parent is not f and f.path[:len(parent.path)] == parent.path:
                    missing = missing & F.col(f"_{parent.name}_text").isNotNull()
            field_reasons.append(_reason(missing, f"missing_field:{f.name}"))
        if f.type in ("boolean", "long", "double", "timestamp"):
            # Optional fields too: a value that is there but unreadable is not the same as absent.
            bad = "bad_timestamp" if f.type == "timestamp" else "wrong_type"
            wrong = text.isNotNull() & F.col(f.name).isNull()
            if rescue_wrong and not f.required:
                wrong_types.append((wrong, f.path))     # the contract keeps the value instead
            else:
                field_reasons.append(_reason(wrong, f"{bad}:{f.name}"))
        if f.name == profile.key_field and is_map:
            # The map key names the element (nest: cameras keyed by device id); a record whose
            # key and field disagree is ambiguous about which device it describes.
            field_reasons.append(_reason((F.trim(text) != "") & (F.col("_element_key") != F.col(f.name)),
                                         f"{f.name}_mismatch"))
    t = profile.event_time
    earliest = F.lit(min_event_time)
    latest = F.col("bronze_ingest_time") + F.make_dt_interval(secs=F.lit(max_future_seconds))
    event_reasons = _reasons(
        *field_reasons,
        _reason((F.col(t) < earliest) | (F.col(t) > latest), f"time_out_of_range:{t}"),
    )
    reasons = F.when(F.col("parsed"), event_reasons).otherwise(F.col("record_reasons"))
    out = (typed.withColumn("reasons", reasons)
           .withColumn("event_id", F.when(F.col("parsed"), _event_id(profile))))
    for name, expression in profile.derived:
        out = out.withColumn(name, F.expr(expression))
    drift = C.event_columns(profile, F.col(C.ELEMENT_MAP), wrong_types) if contract else C.none()
    out = out.withColumns({name: F.when(F.col("parsed"), c) for name, c in drift.items()})
    if carry_bytes:
        out = out.withColumns({c: F.when(~is_accepted(), F.col(c)) for c in RAW_COLUMNS})
    return out.withColumn("event_time", F.col(t)).select(*parsed_columns(profile))


def _event_id(profile: Profile) -> Column:
    """Stable identity of an event: the profile's dedup fields always hash the same, whichever
    record, file or Kafka message carried them. Without a dedup key an event is its position in
    bronze (identical events are distinct events), so only a replay could repeat one."""
    fmt = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
    if profile.dedup:
        kinds = {f.name: f.type for f in profile.fields}
        parts = [F.date_format(c, fmt) if kinds[c] == "timestamp" else F.col(c).cast("string")
                 for c in profile.dedup]
    else:
        parts = [F.col(c).cast("string") for c in (*LINEAGE_COLUMNS[:-1], profile.index)]
    return F.sha2(F.concat_ws("|", *parts), 256)


def parse_events(bronze: DataFrame, min_event_time: datetime, max_future_seconds: float,
                 profile: Profile, max_record_bytes: int | None = None, carry_bytes: int = 0) -> DataFrame:
    """bronze.events rows -> events (reasons empty) and rejects (reasons set), one DataFrame."""
    return explode_events(parse_records(bronze, profile, max_record_bytes), min_event_time,
                          max_future_seconds, profile, carry_bytes)


def is_accepted() -> Column:
    return F.size("reasons") == 0


def accepted(parsed: DataFrame) -> DataFrame:
    return parsed.where(is_accepted())


def rejected(parsed: DataFrame) -> DataFrame:
    return parsed.where(~is_accepted())


REJECT_KEY = "reject"     # a rejected row's dedup key: this, then its bronze position


def deduplicate(parsed: DataFrame, delay: str, profile: Profile) -> DataFrame:
    """Drop repeats of an event_id seen within `delay` of event time.

    In a stream, RocksDB state carries the ids across micro-batches, and accepted events older
    than the watermark are dropped (Spark counts them as numRowsDroppedByWatermark). Rejected
    rows ride along untouched: their event_time is NULL (never late, never moves the
    watermark) and their key is their own bronze position (never a duplicate), so one query
    carries both and each batch's counts add up. A profile without a dedup key drops nothing:
    its event ids are bronze positions, unique by construction.
    """
    ok = is_accepted()
    if not profile.dedup:
        if not parsed.isStreaming:
            return parsed
        # No dedup, but the watermark still tracks the event-time frontier (see FRONTIER).
        timed = parsed.withColumn("event_time", F.when(ok, F.col("event_time")))
        return timed.withWatermark("event_time", delay)
    reject_key = F.concat_ws("|", F.lit(REJECT_KEY), "bronze_source", "bronze_file_path",
                             "bronze_line_number", "bronze_kafka_topic", "bronze_kafka_partition",
                             "bronze_kafka_offset", F.coalesce(F.col(profile.index), F.lit(-1)))
    keyed = (parsed.withColumn("event_time", F.when(ok, F.col("event_time")))
             .withColumn("dedup_key", F.when(ok, F.col("event_id")).otherwise(reject_key)))
    if not keyed.isStreaming:
        # Spark rejects dropDuplicatesWithinWatermark on a static DataFrame; a static batch is
        # all inside one watermark, so a plain dropDuplicates is the same operation there.
        return keyed.dropDuplicates(["dedup_key"]).drop("dedup_key")
    return (keyed.withWatermark("event_time", delay)
            .dropDuplicatesWithinWatermark(["dedup_key"]).drop("dedup_key"))


def late_for_dedup(parsed: DataFrame, watermark_ms: int) -> DataFrame:
    """The accepted events deduplicate's operator drops as late, given the watermark it filters
    a batch's input with (common.internals.running_input): an event time at or before it.
    Rejects never are (no event time)."""
    return parsed.where(is_accepted() & (F.col("event_time") <= F.timestamp_millis(F.lit(watermark_ms))))


def input_metrics(parsed: DataFrame, profile: Profile) -> list[Column]:
    """Counts of a batch before dedup, in both units: each parsed record has exactly one row
    with element index 0; each unparsed record is one row with parsed = false."""
    idx = profile.index
    return [F.count(F.when(F.col(idx) == 0, 1)).alias("records_parsed"),
            F.count(F.when(~F.col("parsed"), 1)).alias("records_quarantined_unparsed"),
            F.count(F.when(F.col("parsed"), 1)).alias("events_parsed")]


def join_dimension(events: DataFrame, dimension: DataFrame, profile: Profile,
                   only: Column | None = None, at: str | None = "event_time") -> DataFrame:
    """Attach the dimension's columns (nest: zip/city/state by device_id) valid at each event's
    time `at`; an event without a dimension row then is kept with NULLs and its flag (nest:
    unknown_device) set, also when the device is located only later (before its first known
    location an event has none: docs/locations.md).

    `dimension` is the history (silver/locations.py): rows valid in [valid_from, valid_to),
    NULL valid_from since always, NULL valid_to still. A device's intervals never overlap, so
    the broadcast hash join on the key with the range as its condition gives each event one
    row. `at=None`: by key alone, for a dimension of one row per key (locations.current: the
    plain baseline's static join).
    The flag comes from the join match, not from a NULL column, so a known key whose reference
    row lacks a value stays distinguishable (gold's quality gate checks exactly that).
    `only`: the rows that look the dimension up (the others keep NULLs): silver joins a batch's
    accepted and rejected rows in one pass, and a reject must never match, let alone twice."""
    dim = profile.dimension
    if dim is None:
        return events
    key, since, until = "_dimension_key", "_valid_from", "_valid_to"
    validity = [F.col("valid_from").alias(since), F.col("valid_to").alias(until)] if at else []
    loc = dimension.select(F.col(dim.key).alias(key), *dim.columns, *validity, F.lit(True).alias("_known"))
    on = F.col(dim.key) == F.col(key)
    if at:
        t = F.col(at)
        on = on & (F.col(since).isNull() | (t >= F.col(since))) & (F.col(until).isNull() | (t < F.col(until)))
    if only is not None:
        on = on & only
    return (events.join(F.broadcast(loc), on, "left")
            .withColumn(dim.flag, F.col("_known").isNull()).drop(key, "_known", *([since, until] if at else [])))


# The latest event_time silver had read before the micro-batch that accepted the row (NULL in
# its first batch). Lateness downstream is measured against it, so it is a fact of the row,
# fixed at ingestion: gold counts an event late without keeping any per-event state, and the
# same event is late or on time however gold's own micro-batches happen to be cut.
FRONTIER = "silver_frontier_time"


def silver_columns(profile: Profile) -> list[str]:
    dim = profile.dimension
    return [*event_columns(profile), "event_date", *((*dim.columns, dim.flag) if dim else ()),
            C.RESCUED_DATA, *LINEAGE_COLUMNS, "silver_batch_id", FRONTIER]


def stats_columns(profile: Profile, schema: StructType) -> list[str]:
    """The columns of silver's events Delta keeps file statistics for (the table property
    delta.dataSkippingStatsColumns): those reads of silver filter or join on. The event's id and
    time (backfills, refreshes, time ranges), the dimension's key and every column a gold table
    groups by (a reader's usual filters), the batch (the audit) and the bronze position (lineage
    back to bronze). Delta's default, every one of the first 32 columns, spent 0.9 s of a
    200,000-event silver write on statistics of names, flags, lineage text and rescued JSON that
    no read skips files by (2.6-2.7 s against 1.7-1.8 s). Only types Delta keeps min/max values
    of (`schema`: silver's): Delta refuses a boolean (nest's unknown_device, a gold group) there."""
    groups = [profile.dimension.key] if profile.dimension else []
    groups += [c for a in profile.aggregations for c in a.group]
    groups += [profile.sessions.key] if profile.sessions else []
    groups += [c for t in profile.tables for c in t.get("group", ())]
    wanted = ["event_id", "event_time", *groups, "silver_batch_id",
              "bronze_file_path", "bronze_line_number", "bronze_kafka_partition", "bronze_kafka_offset"]
    ranged = {f.name for f in schema.fields if isinstance(f.dataType, (
        StringType, NumericType, DateType, TimestampType, TimestampNTZType))}
    have = (set(silver_columns(profile)) & ranged) - {profile.partition}     # a partition needs none
    return list(dict.fromkeys(c for c in wanted if c in have))


def frontier_ms(watermark_ms: int, delay_seconds: float) -> int | None:
    """The frontier of a batch from the watermark it ran with (Spark's watermark is the latest
    event time of the batches before, minus the delay; 0 before any event)."""
    return watermark_ms + int(round(delay_seconds * 1000)) if watermark_ms > 0 else None


def to_silver(events: DataFrame, batch_id: int, profile: Profile,
              frontier: int | None = None, evolved: tuple[tuple[str, str], ...] = ()) -> DataFrame:
    """`frontier`: the batch's FRONTIER in epoch ms (see frontier_ms). `evolved`: (key path,
    column) of the undeclared keys the contract evolves silver by, each value as text (a
    string as itself, any other JSON value as its JSON: what a declared string or json field
    would hold)."""
    cols = silver_columns(profile)
    at = F.timestamp_millis(F.lit(frontier)) if frontier is not None else F.lit(None).cast("timestamp")
    grown = [F.col(C.EVOLVED)[path].cast("string").alias(column) for path, column in evolved]
    return (events.withColumn("event_date", F.to_date("event_time"))
            .withColumn("silver_batch_id", F.lit(batch_id).cast("long"))
            .withColumn(C.RESCUED_DATA, C.rescued_data(F.col(C.RESCUED)))
            .withColumn(FRONTIER, at).select(*cols, *grown))


def bronze_key(prefix: str = "") -> Column:
    """A record's position in bronze as one string: (file, line) or (topic, partition, offset),
    from bronze's columns or, with prefix "bronze_", from the lineage a silver row carries."""
    parts = [c for c in LINEAGE if c != "ingest_time"]      # the lineage, less when it arrived
    return F.concat_ws("|", *[F.col(prefix + p).cast("string") for p in parts])


def fetch_window(bound: Column | None = None) -> list[Column]:
    """Aggregates over a batch's rows: the ingest-time range (epoch µs) of the bronze records
    whose bytes with_record_bytes will fetch for the rows `bound` for quarantine (events that
    did not carry them), so the bronze read skips every other file; NULL when none needs it."""
    needs = F.col("parsed") & F.col(raw_bytes.RAW).isNull()
    needs = needs if bound is None else bound & needs
    micros = F.when(needs, F.unix_micros("bronze_ingest_time"))
    return [F.min(micros).alias("fetch_from"), F.max(micros).alias("fetch_until")]


def with_record_bytes(rows: DataFrame, bronze: DataFrame | None, profile: Profile,
                      fetch_from: int | None, fetch_until: int | None) -> DataFrame:
    """Rows bound for quarantine, with their record's bytes once per record. A record that did
    not parse carried them (its one row). The events of a parsed record get them on their first
    quarantined element (lowest index), the others keeping only the position, so a record of
    20,000 rejected elements is stored once, not 20,000 times: from whichever of its rows
    carried them (explode_events' carry_bytes), else fetched from `bronze`. `fetch_from` /
    `fetch_until`: fetch_window's range over `rows`, which limits the bronze read to the batch's
    own files; None when every event carried its bytes, and `bronze` is then not read. One pass
    over `rows` (a record that did not parse is a record of one row here)."""
    from pyspark.sql import Window

    idx, key, first = profile.index, "_bronze_key", "_first"
    record = Window.partitionBy(key).orderBy(idx)
    whole = record.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    out = (rows.withColumn(key, bronze_key("bronze_"))
           .withColumn(first, F.row_number().over(record) == 1)
           .withColumns({c: F.when(F.col(first), F.first(c, ignorenulls=True).over(whole))
                         for c in RAW_COLUMNS}))
    if fetch_from is not None:
        at = lambda micros: F.timestamp_micros(F.lit(micros))   # noqa: E731 - a literal: Delta skips files by it
        fetched = {c: f"_fetched_{c}" for c in RAW_COLUMNS}
        records = (bronze.where(F.col("ingest_time").between(at(fetch_from), at(fetch_until)))
                   .select(bronze_key().alias("_record_key"), *[F.col(c).alias(f) for c, f in fetched.items()]))
        # Only a record's first row without carried bytes matches: never copied onto other rows.
        missing = F.col(first) & F.col("parsed") & F.col(raw_bytes.RAW).isNull()
        out = (out.join(records, (F.col(key) == F.col("_record_key")) & missing, "left")
               .withColumns({c: F.coalesce(F.col(c), F.col(f)) for c, f in fetched.items()})
               .drop("_record_key", *fetched.values()))
    return out.drop(key, first)


def to_quarantine(rows: DataFrame, batch_id: int, profile: Profile) -> DataFrame:
    return rows.select(
        *RAW_COLUMNS, "reasons", "event_id", *profile.quarantine_columns, *LINEAGE_COLUMNS,
        F.lit(batch_id).cast("long").alias("batch_id"),
        F.current_timestamp().alias("quarantined_at"),
    )


def dedup_keys(state: DataFrame, delay_seconds: float) -> DataFrame:
    """What deduplicate()'s state holds, from its rows as Spark's `statestore` data source reads
    them (key: dedup_key; value: expiresAtMicros, the key's event time + the delay): one row,
    the events' keys held, the rejected rows' keys held (their bronze positions) and the oldest and newest event time among the events'."""
    reject = F.col("key.dedup_key").startswith(f"{REJECT_KEY}|")
    event_time = F.timestamp_micros(F.col("value.expiresAtMicros") - F.lit(int(delay_seconds * 1_000_000)))
    return state.agg(F.count(F.when(~reject, 1)).alias("keys"), F.count(F.when(reject, 1)).alias("reject_keys"),
                     F.min(F.when(~reject, event_time)).alias("oldest_event"),
                     F.max(F.when(~reject, event_time)).alias("newest_event"))


# The state deduplicate() keeps in a stream, as Spark's `statestore` data source reads it:
# a checkpoint holding another shape cannot be resumed by this query.
DEDUP_STATE = ("dedup_key STRING", "expiresAtMicros BIGINT")
