"""Name every Delta table of the lakehouse (`bronze.events`, `gold.device_sessions`, ...).

The lakehouse folder is the catalog: a table is `$root/<layer>/<table>` and its Delta log is
the only metadata. Each session registers what is on disk, so a table written by one process
is visible by name in any other. We avoid a Hive/Derby metastore on purpose: embedded Derby
admits one JVM at a time, which would stop bronze, silver and gold from running concurrently.
"""
from __future__ import annotations

from common.config import Config
from common.storage import is_delta_table


def existing_tables(cfg: Config) -> list[tuple[str, str, str]]:
    """(layer, table, path) for every lakehouse table that has a Delta log on disk."""
    found = []
    for layer, tables in cfg.tables.items():
        for table in tables:
            path = cfg.table_path(layer, table)
            if is_delta_table(path):
                found.append((layer, table, path))
    return found


def ddl(cfg: Config) -> list[str]:
    stmts = [f"CREATE SCHEMA IF NOT EXISTS {layer}" for layer in cfg.tables]
    stmts += [f"CREATE TABLE IF NOT EXISTS {layer}.{table} USING DELTA LOCATION '{path}'"
              for layer, table, path in existing_tables(cfg)]
    return stmts


def register_tables(spark, cfg: Config) -> None:
    for stmt in ddl(cfg):
        spark.sql(stmt)


def register_table(spark, cfg: Config, layer: str, table: str) -> None:
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {layer}")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {cfg.table_name(layer, table)} "
              f"USING DELTA LOCATION '{cfg.table_path(layer, table)}'")
