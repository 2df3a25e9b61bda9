"""Table schemas that more than one layer reads or writes."""
from pyspark.sql.types import (BinaryType, BooleanType, DateType, DoubleType, IntegerType, LongType, MapType,
                               StringType, StructField,
                               StructType, TimestampType)

# bronze.events: the raw record untouched, plus where it came from and when it arrived.
BRONZE_EVENTS = StructType([
    # The record's bytes as they arrived, in one of two columns (common/raw_bytes.py): `raw` when
    # they are valid UTF-8, the text every reader expects; `raw_bytes` when they are not (Parquet
    # strings must be UTF-8: such bytes in a string column make delta-rs and DuckDB refuse the table).
    StructField("raw", StringType(), True),
    StructField("source", StringType(), False),         # 'file' | 'kafka'
    StructField("file_path", StringType(), True),
    StructField("line_number", LongType(), True),       # 1-based, within file_path
    StructField("file_modification_time", TimestampType(), True),
    StructField("kafka_topic", StringType(), True),
    StructField("kafka_partition", IntegerType(), True),
    StructField("kafka_offset", LongType(), True),
    StructField("kafka_timestamp", TimestampType(), True),
    StructField("kafka_key", StringType(), True),
    StructField("ingest_time", TimestampType(), False),
    StructField("ingest_date", DateType(), False),
    StructField("raw_bytes", BinaryType(), True),        # set only where raw is not valid UTF-8
    StructField("kafka_key_bytes", BinaryType(), True),  # set only where kafka_key is not
])
BRONZE_PARTITION = ["ingest_date"]

# ops.batch_accounting: one row per micro-batch per layer. Record and event units are kept
# apart because a bronze record can hold several camera events.
BATCH_ACCOUNTING = StructType([
    StructField("layer", StringType(), False),
    StructField("query", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("recorded_at", TimestampType(), False),
    StructField("records_in", LongType(), True),
    StructField("records_parsed", LongType(), True),
    StructField("records_quarantined_unparsed", LongType(), True),
    StructField("events_parsed", LongType(), True),
    StructField("events_written", LongType(), True),
    StructField("events_quarantined", LongType(), True),
    StructField("duplicates_dropped", LongType(), True),
    StructField("late_dropped", LongType(), True),
    StructField("rows_in", LongType(), True),
    StructField("rows_written", LongType(), True),
    StructField("batch_ms", LongType(), True),        # the trigger up to this row (all but its commit)
    StructField("quality_ms", LongType(), True),      # quality gate: validating the batch
    # The checkpoint's id (lineage query_id): batch ids restart when a refresh puts a new
    # checkpoint in place, so the audit sums a table's drops by the checkpoints that built it.
    StructField("query_id", StringType(), True),
    # The schema contract (silver): events written with rescued data, and their rescued keys.
    StructField("events_rescued", LongType(), True),
    StructField("fields_rescued", LongType(), True),
])

# ops.new_fields: per silver batch, each key no field of the profile declares, what the contract
# did with it and how many records carried it (first appearance: the earliest row of a field).
NEW_FIELDS = StructType([
    StructField("query", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("field", StringType(), False),        # its path: a.b in the element, $.a in the record
    StructField("level", StringType(), False),        # record | element | nested | wrong_type
    StructField("mode", StringType(), False),         # rescue | evolve | fail
    StructField("column", StringType(), True),        # evolve: the silver column it became
    StructField("records", LongType(), False),
    StructField("events", LongType(), False),
    StructField("first_at", StringType(), True),      # the batch's first bronze record carrying it
    StructField("recorded_at", TimestampType(), False),
])

DQ_RESULTS = StructType([
    StructField("query", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("table_name", StringType(), False),
    StructField("suite", StringType(), False),
    StructField("expectation", StringType(), False),
    StructField("expectation_type", StringType(), False),
    StructField("policy", StringType(), False),
    StructField("success", BooleanType(), False),
    StructField("element_count", LongType(), True),
    StructField("unexpected_count", LongType(), True),
    StructField("observed_value", StringType(), True),
    StructField("evaluated_at", TimestampType(), False),
    # The expectation's GX result (ExpectationValidationResult JSON, row lists cut to a sample):
    # what `make dq-docs` renders. Null in rows written before the column existed.
    StructField("result_json", StringType(), True),
])

# ops.query_progress: every progress event of every streaming query (common/progress.py),
# plus one row when a query starts (event = 'started') and one when it terminates
# (event = 'terminated', with its error if it failed).
QUERY_PROGRESS = StructType([
    StructField("event", StringType(), False),          # 'started' | 'progress' | 'terminated'
    StructField("query_name", StringType(), True),
    StructField("query_id", StringType(), False),
    StructField("run_id", StringType(), False),
    StructField("batch_id", LongType(), True),
    StructField("timestamp", TimestampType(), False),   # trigger start (progress), start or termination
    StructField("input_rows", LongType(), True),
    StructField("input_rows_per_second", DoubleType(), True),
    StructField("processed_rows_per_second", DoubleType(), True),
    StructField("batch_duration_ms", LongType(), True),
    StructField("duration_ms", MapType(StringType(), LongType()), True),   # addBatch, getBatch, ...
    StructField("state_rows", LongType(), True),
    StructField("state_memory_bytes", LongType(), True),
    StructField("watermark", TimestampType(), True),
    StructField("source_lag", LongType(), True),        # behind the source's latest offset
    StructField("lag_unit", StringType(), True),        # 'messages' (Kafka) | 'versions' (Delta)
    StructField("sources", StringType(), True),         # the progress' sources, JSON
    StructField("error", StringType(), True),
    StructField("recorded_at", TimestampType(), False),
])
