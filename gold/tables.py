"""The gold tables of a profile, as instances of their kinds (gold/kinds), every setting
resolved. The profile declares them: `aggregations:` (windowed tables), `sessions:` and, for any
kind, `tables:` entries naming their `kind`.

Shared by the streaming job and by the audit, which rebuilds every table version in batch
with the kinds' own `expected`. One streaming query writes every table of a selection
(`query_name`): it reads silver once per micro-batch."""
from __future__ import annotations

from common.config import ConfigError
from gold.kinds import Declaring, GoldTable, kind, known_kinds


def gold_tables(cfg) -> tuple[GoldTable, ...]:
    profile = cfg.profile
    columns = frozenset(profile.columns)
    at = lambda *key: Declaring(f"{profile.file}: {'.'.join(map(str, key))}", cfg.duration, columns)  # noqa: E731
    tables = [kind("windowed").declare(a, at("aggregations", a.key)) for a in profile.aggregations]
    if profile.sessions:
        tables.append(kind("sessions").declare(profile.sessions, at("sessions")))
    for i, entry in enumerate(profile.tables):
        try:
            cls = kind(entry["kind"])
        except KeyError:
            raise ConfigError(f"{profile.file}: key 'tables.{i}.kind': unknown kind {entry['kind']!r} "
                              f"(known: {', '.join(known_kinds())})") from None
        tables.append(cls.declare(entry, at("tables", i)))
    stateful = [t.table for t in tables if t.stateful]
    if len(stateful) > 1:
        raise ConfigError(f"{profile.file}: one gold query keeps the state of one stateful table, "
                          f"and {', '.join(stateful)} are")
    return tuple(tables)


for_config = gold_tables


def by_table(cfg) -> dict[str, GoldTable]:
    return {t.table: t for t in for_config(cfg)}


def logic_hash(cfg) -> str:
    """What decides every gold row, hashed: each table as its kind resolved it from the profile
    (windows, gaps, measures, groups) and gold's watermark. Every gold commit's lineage carries
    it, so the audit recomputes a version with the logic that made it, or says it cannot (a
    profile changed since: `lakehouse refresh gold` rebuilds the tables with today's)."""
    import hashlib

    return hashlib.sha256(repr((for_config(cfg), cfg.gold.watermark)).encode()).hexdigest()[:16]


def query_name(cfg, tables) -> str:
    """The one streaming query that writes `tables`: `gold` for every table of the profile,
    `gold_<key>_<key>...` for a subset (`--only`), each with a checkpoint of its own."""
    everything = [t.key for t in for_config(cfg)]
    chosen = [t.key for t in tables]
    return "gold" if sorted(chosen) == sorted(everything) else "_".join(["gold", *[k for k in everything if k in chosen]])
