"""bronze.events rows built by hand, as the file source writes them (common.schemas.BRONZE_EVENTS)."""
from __future__ import annotations

from datetime import datetime


def bronze_row(raw: str | bytes | None, line: int, file: str, ingest: datetime) -> tuple:
    """`raw`: the line, as text or as bytes; bytes that are not UTF-8 go to raw_bytes, as bronze
    keeps them (common/raw_bytes.py)."""
    raw_bytes = None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raw, raw_bytes = None, bytearray(raw)
    return (raw, "file", file, line, ingest, None, None, None, None, None, ingest, ingest.date(),
            raw_bytes, None)
