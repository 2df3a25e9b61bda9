"""Bronze transforms: raw input DataFrames -> rows of bronze.events. Pure, batch or streaming.

Nothing is parsed or dropped here: every line or message becomes one row, bytes untouched.
"""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common.schemas import BRONZE_EVENTS

# ISO-8859-1 maps each byte to one char and back, so splitting the decoded text on '\n' and
# re-encoding gives back each line's exact bytes, even bytes that are not valid UTF-8.
# (Splitting a plain string cast would decode as UTF-8 and replace bad bytes with U+FFFD.)
_LOSSLESS = "ISO-8859-1"


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
    text = F.decode("content", _LOSSLESS)
    split = files.select("path", "modificationTime",
                         (F.array(text) if whole_file else F.split(text, "\n", -1)).alias("parts"))
    parts = F.col("parts")
    lines = F.when(F.element_at(parts, -1) == "", F.slice(parts, 1, F.size(parts) - 1)).otherwise(parts)
    files_with_lines = split.select("path", "modificationTime", lines.alias("lines"))
    out = (files_with_lines.select("path", "modificationTime",
                                   F.posexplode("lines").alias("pos", "text"))
           .select(
               F.encode("text", _LOSSLESS).cast("string").alias("raw"),
               F.lit("file").alias("source"),
               F.col("path").alias("file_path"),
               (F.col("pos") + 1).cast("long").alias("line_number"),
               F.col("modificationTime").alias("file_modification_time"),
               F.lit(None).cast("string").alias("kafka_topic"),
               F.lit(None).cast("int").alias("kafka_partition"),
               F.lit(None).cast("long").alias("kafka_offset"),
               F.lit(None).cast("timestamp").alias("kafka_timestamp"),
               F.lit(None).cast("string").alias("kafka_key"),
           ))
    return _with_ingest(out)


def rows_from_kafka(messages: DataFrame) -> DataFrame:
    """Kafka source rows -> bronze rows; value bytes are kept as they are (cast, not decoded)."""
    out = messages.select(
        F.col("value").cast("string").alias("raw"),
        F.lit("kafka").alias("source"),
        F.lit(None).cast("string").alias("file_path"),
        F.lit(None).cast("long").alias("line_number"),
        F.lit(None).cast("timestamp").alias("file_modification_time"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").cast("string").alias("kafka_key"),
    )
    return _with_ingest(out)
