"""Table names for the audit tools, and who reads and writes each table as a stream."""
from __future__ import annotations

from pathlib import Path

from common.errors import JobError
from common.config import Config
from common.storage import is_delta_table


def writers(cfg: Config) -> dict[str, tuple[str, ...]]:
    """Streaming queries that write each table (their checkpoints hold how far they got)."""
    return {"bronze.events": ("bronze_files", "bronze_kafka"),
            f"silver.{cfg.silver_table}": ("silver",),
            "silver.quarantine": ("silver",),
            **{f"gold.{t}": ("gold",) for t in cfg.tables["gold"]},
            "silver.late_events": ("silver", "gold")}   # the late events they keep (common/late.py)


def stream_readers(cfg: Config) -> dict[str, tuple[str, ...]]:
    """Streaming queries that read each table as a Delta stream source."""
    return {"bronze.events": ("silver",),
            f"silver.{cfg.silver_table}": ("gold",)}


def outputs(cfg: Config) -> dict[str, tuple[str, ...]]:
    """Tables a query writes, so a reset knows what to rebuild with it."""
    w = writers(cfg)
    return {q: tuple(t for t, ws in w.items() if q in ws) for q in {q for ws in w.values() for q in ws}}


class TableError(JobError, ValueError):
    """An unknown table name, or a table that does not exist on disk."""


def all_names(cfg: Config) -> list[str]:
    return [f"{layer}.{t}" for layer, ts in cfg.tables.items() for t in ts]


def resolve(cfg: Config, name: str, must_exist: bool = True) -> str:
    """Path of `layer.table`; a clear error for unknown names and missing tables."""
    layer, _, table = name.partition(".")
    if table not in cfg.tables.get(layer, ()):
        raise TableError(f"unknown table {name!r}; known tables: {', '.join(all_names(cfg))}")
    path = cfg.table_path(layer, table)
    if must_exist and not is_delta_table(path):
        raise TableError(f"table {name} does not exist at {path} (has its job run?)")
    return path


def existing(cfg: Config) -> list[str]:
    return [n for n in all_names(cfg) if is_delta_table(resolve(cfg, n, must_exist=False))]
