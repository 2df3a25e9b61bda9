"""Delta helpers every layer uses: create-if-missing with a fixed schema, idempotent writes."""
from __future__ import annotations

from delta.tables import DeltaTable

from common.catalog import register_table
from common.config import Config


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


def idempotent_append(df, path: str, app_id: str, version: int) -> None:
    """Append once per (app_id, version): a retried micro-batch re-sends the same version and
    Delta skips it (txnAppId/txnVersion), so nothing is written twice."""
    (df.write.format("delta").mode("append")
       .option("txnAppId", app_id).option("txnVersion", version)
       .save(path))
