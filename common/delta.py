"""Delta helpers every layer uses: create-if-missing with a fixed schema, idempotent writes,
commit metadata."""
from __future__ import annotations

from contextlib import contextmanager

from delta.tables import DeltaTable

from common.catalog import register_table
from common.config import Config
from common.lineage import USER_METADATA_CONF, to_user_metadata


def ensure_table(spark, cfg: Config, layer: str, table: str, schema, partition_by=(),
                 properties: dict[str, str] | None = None) -> str:
    path = cfg.table_path(layer, table)
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    builder.execute()
    register_table(spark, cfg, layer, table)
    return path


LOCAL_FRAME_MAX_ROWS = 500     # past this a literal plan costs more to analyse than the RDD path


def local_frame(spark, rows, schema):
    """A small DataFrame of Python rows (tuples in `schema` order) built from literals, in one
    partition. createDataFrame pickles the rows into an RDD spread over default.parallelism
    partitions; for the few rows of an ops table that costs about as much as the Delta commit
    itself, which is on every micro-batch's path."""
    from pyspark.sql import functions as F

    if not rows or len(rows) > LOCAL_FRAME_MAX_ROWS:
        return spark.createDataFrame(rows, schema)
    structs = [F.struct(*[_literal(value, f.dataType).alias(f.name) for value, f in zip(row, schema.fields)])
               for row in rows]
    return spark.range(1, numPartitions=1).select(F.inline(F.array(*structs)))


def _literal(value, data_type):
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    if value is None:
        return F.lit(None).cast(data_type)
    if isinstance(data_type, MapType):
        if not value:
            return F.create_map().cast(data_type)
        return F.create_map(*[F.lit(x) for kv in value.items() for x in kv]).cast(data_type)
    return F.lit(value).cast(data_type)


def idempotent_append(df, path: str, app_id: str, version: int, metadata: dict | None = None) -> None:
    """Append once per (app_id, version): a retried micro-batch re-sends the same version and
    Delta skips it (txnAppId/txnVersion), so nothing is written twice. `metadata` (the batch's
    lineage) is stored as the commit's user metadata."""
    writer = (df.write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", version))
    if metadata is not None:
        writer = writer.option("userMetadata", to_user_metadata(metadata))
    writer.save(path)


@contextmanager
def commit_metadata(session, metadata: dict):
    """Commits made inside (MERGE has no writer option) carry `metadata` as user metadata.

    Pass the micro-batch's own session (batch_df.sparkSession): each streaming query runs on a
    clone of the job's session, so concurrent queries do not see each other's setting."""
    session.conf.set(USER_METADATA_CONF, to_user_metadata(metadata))
    try:
        yield
    finally:
        session.conf.unset(USER_METADATA_CONF)
