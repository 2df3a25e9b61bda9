"""The gold tables: name, MERGE keys and how each is built from on-time silver events.

Shared by the streaming job and by the audit, which rebuilds every table version in batch
with these same builders."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gold import sessions as S
from gold import transform as T


@dataclass(frozen=True)
class GoldTable:
    key: str                       # short name for --only
    table: str                     # gold.<table>
    keys: tuple[str, ...]          # MERGE keys
    build: Callable                # (on-time silver events, cfg) -> DataFrame, streaming or batch
    windowed: bool = True

    @property
    def query(self) -> str:
        return f"gold_{self.table}"


TABLES = (
    GoldTable("sightings", "zip_hourly_sightings", ("window_start", "zip_code", "unknown_device"),
              lambda ev, cfg: T.hourly_sightings(ev, cfg.gold.sightings_window.spark())),
    GoldTable("activity", "device_activity", ("window_start", "device_id"),
              lambda ev, cfg: T.device_activity(ev, cfg.gold.activity_window.spark(),
                                                cfg.gold.activity_slide.spark())),
    GoldTable("sessions", "device_sessions", ("device_id", "session_id"),
              lambda ev, cfg: S.sessionize(ev, cfg.gold.session_gap.seconds), windowed=False),
)

BY_TABLE = {t.table: t for t in TABLES}
