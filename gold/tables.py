"""The gold tables of a profile: name, MERGE keys and how each is built from on-time silver
events. The profile declares them (aggregations: group columns, window, slide, measures;
sessions: key and gap); this module turns each declaration into a builder.

Shared by the streaming job and by the audit, which rebuilds every table version in batch
with these same builders. One streaming query writes every table of a selection (`query_name`):
it reads silver once per micro-batch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from common.config import ConfigError
from common.profile import Aggregation, Profile, Sessions
from gold import sessions as S
from gold import transform as T


@dataclass(frozen=True)
class GoldTable:
    key: str                       # short name for --only
    table: str                     # gold.<table>
    keys: tuple[str, ...]          # MERGE keys
    build: Callable                # (on-time silver events, cfg) -> DataFrame, streaming or batch
    windowed: bool = True
    sessions: Sessions | None = None   # the profile's sessions declaration (gap: duration or $config.key)
    publish: tuple | None = None   # (key columns, value column) for gold.stats_to_kafka
    measures: tuple = ()           # windowed: the profile's (name, aggregate expression) pairs

    def combine(self, part, current, close_at_ms: int | None = None):
        """Windowed: a micro-batch's part of each window it touched (`build` over the batch's
        events), folded into the table's current rows: those windows' values after the batch;
        with `close_at_ms`, and the rows that watermark closes (T.combine)."""
        return T.combine(part, current, self.keys, self.measures, close_at_ms)

    def session_spec(self, cfg) -> S.SessionSpec:
        return _session_spec(self.sessions, cfg)

    def behind_watermark(self, table, cfg, watermark_ms: int):
        """Sessions: the table's rows the watermark has closed that still say open, closed.
        (A windowed table's come out of `combine`, from the read of the table it makes anyway.)"""
        return S.closing(table, self.session_spec(cfg), watermark_ms)


def _session_spec(sessions: Sessions, cfg) -> S.SessionSpec:
    return S.SessionSpec.of(sessions, cfg.duration(sessions.gap).seconds)


def _aggregation(agg: Aggregation, profile: Profile) -> GoldTable:
    for name, expression in agg.measures:
        try:
            T.combinable(name, expression)
        except ValueError as e:
            raise ConfigError(f"{profile.file}: aggregations.{agg.key}: {e}") from None

    def build(events, cfg):
        return T.windowed_aggregate(events, agg.group, cfg.duration(agg.window).spark(),
                                    cfg.duration(agg.slide).spark() if agg.slide else None,
                                    agg.measures)
    publish = (agg.publish_key, agg.publish_value) if agg.publish_value else None
    return GoldTable(agg.key, agg.table, ("window_start", *agg.group), build, publish=publish,
                     measures=tuple(agg.measures))


def gold_tables(profile: Profile) -> tuple[GoldTable, ...]:
    tables = [_aggregation(a, profile) for a in profile.aggregations]
    if profile.sessions:
        s = profile.sessions
        tables.append(GoldTable("sessions", s.table, (s.key, "session_id"),
                                lambda ev, cfg, s=s: S.sessionize(ev, _session_spec(s, cfg)),
                                windowed=False, sessions=s))
    return tuple(tables)


def for_config(cfg) -> tuple[GoldTable, ...]:
    return gold_tables(cfg.profile)


def by_table(cfg) -> dict[str, GoldTable]:
    return {t.table: t for t in for_config(cfg)}


def query_name(cfg, tables) -> str:
    """The one streaming query that writes `tables`: `gold` for every table of the profile,
    `gold_<key>_<key>...` for a subset (`--only`), each with a checkpoint of its own."""
    everything = [t.key for t in for_config(cfg)]
    chosen = [t.key for t in tables]
    return "gold" if sorted(chosen) == sorted(everything) else "_".join(["gold", *[k for k in everything if k in chosen]])
