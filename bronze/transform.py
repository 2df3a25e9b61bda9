"""Bronze transforms: raw input DataFrames -> rows of bronze.events. Pure, batch or streaming.

Nothing is parsed or dropped here: every line or message becomes one row, bytes untouched.
"""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType

from common import raw_bytes
from common.jars import register_java_function
from common.schemas import BRONZE_EVENTS

# The file's bytes -> its lines' bytes, split on '\n' in one pass (jvm/bronze-lines, built at
# setup). Spark's own split works on decoded text: splitting a string cast decodes UTF-8 and
# replaces bad bytes with U+FFFD, and the lossless way (decode ISO-8859-1, split, encode back)
# copied every byte six times, ~2 s of CPU per 200,000 events. The line's bytes then go to raw
# or raw_bytes as they are (common/raw_bytes.py).
SPLIT_LINES = "bronze_split_lines"
_SPLIT_LINES_CLASS = "bronzelines.SplitLines"


def _split_lines(spark) -> None:
    register_java_function(spark, SPLIT_LINES, _SPLIT_LINES_CLASS, ArrayType(BinaryType()), "bronze-lines")


def _with_ingest(df: DataFrame) -> DataFrame:
    # current_timestamp() is fixed per micro-batch and recorded in the offset log, so a
    # replayed batch stamps the same time.
    return (df.withColumn("ingest_time", F.current_timestamp())
              .withColumn("ingest_date", F.to_date("ingest_time"))
              .select(*[f.name for f in BRONZE_EVENTS.fields]))


def lines_from_files(files: DataFrame, whole_file: bool = False) -> DataFrame:
    """binaryFile rows (path, modificationTime, content) -> one row per line, with line numbers.

    A final newline ends the last line rather than starting an empty one; every other empty
    line is a record of its own (it arrived, so bronze keeps it). With whole_file (a profile's
    `source.record: file`, e.g. one multi-line JSON object per file) each file is one record.
    """
    # Split once per file in its own projection, then explode: referencing the split next to
    # the generator made Spark re-split the whole file for every line it emitted (quadratic).
    if whole_file:   # an empty file holds no record, as with the splitter
        lines = F.when(F.length("content") > 0, F.array("content")).otherwise(F.array().cast("array<binary>"))
    else:
        _split_lines(files.sparkSession)
        lines = F.call_function(SPLIT_LINES, "content")
    files_with_lines = files.select("path", "modificationTime", lines.alias("lines"))
    out = (files_with_lines.select("path", "modificationTime",
                                   F.posexplode("lines").alias("pos", "line"))
           .select(
               *raw_bytes.split(F.col("line")),
               F.lit("file").alias("source"),
               F.col("path").alias("file_path"),
               (F.col("pos") + 1).cast("long").alias("line_number"),
               F.col("modificationTime").alias("file_modification_time"),
               F.lit(None).cast("string").alias("kafka_topic"),
               F.lit(None).cast("int").alias("kafka_partition"),
               F.lit(None).cast("long").alias("kafka_offset"),
               F.lit(None).cast("timestamp").alias("kafka_timestamp"),
               F.lit(None).cast("string").alias("kafka_key"),
               F.lit(None).cast("binary").alias("kafka_key_bytes"),
           ))
    return _with_ingest(out)


def rows_from_kafka(messages: DataFrame) -> DataFrame:
    """Kafka source rows -> bronze rows; value bytes are kept as they are (common/raw_bytes.py)."""
    out = messages.select(
        *raw_bytes.split(F.col("value")),
        F.lit("kafka").alias("source"),
        F.lit(None).cast("string").alias("file_path"),
        F.lit(None).cast("long").alias("line_number"),
        F.lit(None).cast("timestamp").alias("file_modification_time"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        *raw_bytes.split(F.col("key"), raw_bytes.KEY),
    )
    return _with_ingest(out)
