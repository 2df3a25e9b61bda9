"""Source profiles: what a feed looks like and which tables the pipeline builds from it.

A profile (conf/profiles/<name>.yaml, chosen with PROFILE=<name>, nest by default) declares the
source format, the raw JSON schema, how records explode into events and which fields those carry,
the event-time column, the dedup key, an optional dimension join, the gold aggregations and
sessions, and the table names. The layer jobs interpret it; none of them knows any one feed.
Any other top-level key of a profile is a conf/lakehouse.yaml section merged over the defaults
(e.g. `bronze: {max_files_per_trigger: 1}`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.errors import JobError

DEFAULT_PROFILE = "nest"
PROFILE_KEYS = ("description", "source", "parse", "dimension", "silver_table", "aggregations",
                "sessions")
FIELD_TYPES = ("string", "boolean", "long", "double", "timestamp", "json", "present")
TIME_FORMATS = ("iso", "epoch_seconds", "epoch_millis")
# Columns silver adds itself; a declared field or derived column may not take these names.
RESERVED = {"raw", "parsed", "reasons", "event_id", "event_time", "event_date", "silver_batch_id",
            "silver_frontier_time",
            "batch_id", "quarantined_at", "window_start", "window_end", "finalized"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ProfileError(JobError, ValueError):
    """A profile file is missing or declares something the pipeline cannot run."""


@dataclass(frozen=True)
class Field:
    name: str
    path: tuple[str, ...]          # inside the exploded element (or the record when nothing explodes)
    type: str = "string"
    required: bool = False
    format: str = "iso"            # timestamps only


@dataclass(frozen=True)
class Aggregation:
    key: str                       # gold.job --only name
    table: str
    group: tuple[str, ...]
    window: str                    # a duration, or $section.key of the lakehouse config
    slide: str | None
    measures: tuple[tuple[str, str], ...]    # (output column, Spark SQL aggregate expression)
    publish_key: tuple[str, ...] | None = None  # gold.stats_to_kafka: key columns
    publish_value: str | None = None             # ... and the value column


@dataclass(frozen=True)
class Sessions:
    key: str
    table: str
    gap: str
    measures: tuple[tuple[str, str], ...] = ()   # (output column, per-event integer SQL expression)
    latest: tuple[str, ...] = ()                 # columns whose latest event's value a session keeps


@dataclass(frozen=True)
class Dimension:
    table: str
    key: str
    columns: tuple[str, ...]
    flag: str                      # boolean column: no dimension row matched
    csv: str                       # file name under paths.reference, loaded on first run


@dataclass(frozen=True)
class Profile:
    name: str
    file: Path
    description: str
    record: str                    # line | file
    compression: str               # none | gzip
    schema: str | None             # raw record schema (Spark DDL); None: derived from the fields
    explode_path: tuple[str, ...] | None
    index: str                     # column holding the element's position in its record
    key_field: str | None          # a map's key must equal this field (else <field>_mismatch)
    fields: tuple[Field, ...]
    derived: tuple[tuple[str, str], ...]
    event_time: str
    dedup: tuple[str, ...] | None
    quarantine_columns: tuple[str, ...]
    partition: str | None
    silver_table: str
    dimension: Dimension | None
    aggregations: tuple[Aggregation, ...]
    sessions: Sessions | None

    @property
    def outputs(self) -> list[str]:
        """Declared fields that become columns (presence checks do not)."""
        return [f.name for f in self.fields if f.type != "present"]

    @property
    def gold_tables(self) -> tuple[str, ...]:
        return tuple(a.table for a in self.aggregations) + ((self.sessions.table,) if self.sessions else ())


def profiles_dir(env: dict[str, str], repo_root: Path) -> Path:
    return Path(env.get("PROFILES_DIR") or repo_root / "conf" / "profiles")


def read_profile(name: str, directory: Path) -> tuple[Path, dict]:
    if not _NAME.match(name or ""):
        raise ProfileError(f"PROFILE={name!r}: a profile name is letters, digits and underscores")
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        raise ProfileError(f"profile {name!r} not found: no {path}"
                           + (f" (known: {', '.join(known)})" if known else ""))
    return path, yaml_mapping(path, ProfileError)


def yaml_mapping(path: Path, error: type[Exception]) -> dict:
    """A YAML file whose top level is a mapping (empty file: {}); anything else raises `error`
    naming the file."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: top level must be a mapping")
    return raw


class _Reader:
    """Typed access to one mapping of the profile; every error names the file and the key."""

    def __init__(self, file: Path, raw: Any, where: str):
        self.file, self.where = file, where
        if not isinstance(raw, dict):
            self.fail(f"must be a mapping, got {raw!r}")
        self.raw = raw

    def fail(self, msg: str, key: str | None = None):
        at = f"{self.where}.{key}" if key and self.where else (key or self.where or "<top>")
        raise ProfileError(f"{self.file}: key '{at}': {msg}")

    def only(self, *known: str) -> None:
        unknown = sorted(set(self.raw) - set(known))
        if unknown:
            self.fail(f"unknown key (known: {', '.join(known)})", unknown[0])

    def get(self, key: str, default: Any = ..., kind: type | tuple = str, choices=None) -> Any:
        if key not in self.raw:
            if default is ...:
                self.fail("missing", key)
            return default
        v = self.raw[key]
        if v is None and default is not ...:
            return default
        if kind is str and isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, kind) or (kind is str and not v.strip()):
            self.fail(f"expected {_kind_name(kind)}, got {v!r}", key)
        if choices and v not in choices:
            self.fail(f"expected one of {', '.join(choices)}, got {v!r}", key)
        return v

    def name(self, key: str, default: Any = ...) -> Any:
        v = self.get(key, default)
        if v is not None and v is not default and not _NAME.match(v):
            self.fail(f"{v!r} is not a column/table name (letters, digits, underscores)", key)
        return v

    def names(self, key: str, default: Any = ...) -> tuple[str, ...] | None:
        v = self.get(key, default, kind=(list, str))
        if v is None or v is default:
            return v
        v = [v] if isinstance(v, str) else v
        for item in v:
            if not isinstance(item, str) or not _NAME.match(item):
                self.fail(f"{item!r} is not a column name", key)
        return tuple(v)

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.file, self.raw.get(key), f"{self.where}.{key}" if self.where else key)


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a non-empty string", list: "a list", dict: "a mapping", bool: "true/false"}
                       .get(k, k.__name__) for k in kinds)


def parse_profile(name: str, file: Path, raw: dict) -> Profile:
    """Validate the profile's own keys (PROFILE_KEYS) into a Profile."""
    top = _Reader(file, {k: v for k, v in raw.items() if k in PROFILE_KEYS}, "")
    src = top.sub("source") if "source" in raw else _Reader(file, {}, "source")
    src.only("record", "compression")
    p = top.sub("parse")
    p.only("schema", "explode", "index", "fields", "derived", "event_time", "dedup",
           "quarantine_columns", "partition", "key_field")

    explode = p.get("explode", None)
    fields_raw = p.get("fields", kind=list)
    if not fields_raw:
        p.fail("declare at least one field", "fields")
    fields = []
    for i, f in enumerate(fields_raw):
        r = _Reader(file, f, f"parse.fields[{i}]")
        r.only("name", "path", "type", "required", "format")
        fname = r.name("name")
        ftype = r.get("type", "string", choices=FIELD_TYPES)
        fields.append(Field(fname, tuple(r.get("path", fname).split(".")), ftype,
                            r.get("required", False, kind=bool),
                            r.get("format", "iso", choices=TIME_FORMATS)))
    names = [f.name for f in fields]
    derived_raw = p.get("derived", {}, kind=dict)
    derived = tuple((k, str(v)) for k, v in derived_raw.items())
    for col in [*names, *(k for k, _ in derived)]:
        if col in RESERVED:
            p.fail(f"'{col}' is a column silver adds itself; rename the field", "fields")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        p.fail(f"field '{dupes[0]}' declared twice", "fields")
    columns = set(names) | {k for k, _ in derived}
    event_time = p.name("event_time")
    by_name = {f.name: f for f in fields}
    if by_name.get(event_time) is None or by_name[event_time].type != "timestamp":
        p.fail(f"'{event_time}' must be a declared field of type timestamp", "event_time")
    if not by_name[event_time].required:
        p.fail(f"field '{event_time}' is the event time, so it must be required: true", "event_time")
    dedup = p.names("dedup", None)
    for col in dedup or ():
        if col not in by_name:
            p.fail(f"'{col}' is not a declared field", "dedup")
    quarantine_columns = p.names("quarantine_columns", ())
    for col in quarantine_columns:
        if col not in by_name:
            p.fail(f"'{col}' is not a declared field", "quarantine_columns")

    dimension = None
    if raw.get("dimension") is not None:
        d = top.sub("dimension")
        d.only("table", "key", "columns", "flag", "csv")
        dimension = Dimension(d.name("table"), d.name("key"), d.names("columns"), d.name("flag"),
                              d.get("csv"))
        if dimension.key not in by_name:
            d.fail(f"'{dimension.key}' is not a declared field", "key")
        columns |= {*dimension.columns, dimension.flag}

    aggs = []
    for i, a in enumerate(top.get("aggregations", [], kind=list)):
        r = _Reader(file, a, f"aggregations[{i}]")
        r.only("table", "key", "group", "window", "slide", "measures", "publish")
        table = r.name("table")
        group = r.names("group", ())
        for col in group:
            if col not in columns:
                r.fail(f"'{col}' is neither a field, a derived column nor a dimension column", "group")
        measures = r.get("measures", kind=dict)
        if not measures:
            r.fail("declare at least one measure", "measures")
        for m in measures:
            if not _NAME.match(str(m)):
                r.fail(f"{m!r} is not a column name", "measures")
        pub_key = pub_value = None
        if r.raw.get("publish") is not None:
            pub = r.sub("publish")
            pub.only("key", "value")
            pub_key, pub_value = pub.names("key"), pub.name("value")
            if pub_value not in measures:
                pub.fail(f"'{pub_value}' is not one of this table's measures", "value")
        aggs.append(Aggregation(r.name("key", table), table, group, r.get("window"), r.get("slide", None),
                                tuple((str(k), str(v)) for k, v in measures.items()), pub_key, pub_value))
    sessions = None
    if raw.get("sessions") is not None:
        s = top.sub("sessions")
        s.only("table", "key", "gap", "measures", "latest")
        measures = s.get("measures", {}, kind=dict)
        latest = s.names("latest", ())
        sessions = Sessions(s.name("key"), s.name("table"), s.get("gap"),
                            tuple((str(k), str(v)) for k, v in measures.items()), latest)
        if sessions.key not in columns:
            s.fail(f"'{sessions.key}' is neither a field, a derived column nor a dimension column", "key")
        for col in latest:
            if col not in columns:
                s.fail(f"'{col}' is neither a field, a derived column nor a dimension column", "latest")
        reserved = {sessions.key, "session_id", "session_start", "session_end", "duration_seconds",
                    "events", "status", *latest}
        for m in measures:
            if not _NAME.match(str(m)):
                s.fail(f"{m!r} is not a column name", "measures")
            if m in reserved:
                s.fail(f"measure '{m}' clashes with a column every session row has", "measures")
    tables = [a.table for a in aggs] + ([sessions.table] if sessions else [])
    dupes = sorted({t for t in tables if tables.count(t) > 1})
    if dupes:
        top.fail(f"gold table '{dupes[0]}' declared twice", "aggregations")
    keys = [a.key for a in aggs] + (["sessions"] if sessions else [])
    if len(set(keys)) != len(keys):
        top.fail("two aggregations share a key", "aggregations")

    explode_path = None
    if explode is not None:
        explode_path = tuple(explode.split("."))
    key_field = p.name("key_field", None)
    if key_field is not None:
        if explode_path is None:
            p.fail("key_field needs an explode over a map", "key_field")
        if key_field not in by_name:
            p.fail(f"'{key_field}' is not a declared field", "key_field")
    return Profile(
        name=name, file=file, description=top.get("description", "", kind=str),
        record=src.get("record", "line", choices=("line", "file")),
        compression=src.get("compression", "none", choices=("none", "gzip")),
        schema=p.get("schema", None), explode_path=explode_path,
        index=p.name("index", "element_index"), key_field=key_field, fields=tuple(fields), derived=derived,
        event_time=event_time, dedup=dedup, quarantine_columns=quarantine_columns,
        partition=p.name("partition", "event_date"),
        silver_table=top.name("silver_table"), dimension=dimension,
        aggregations=tuple(aggs), sessions=sessions)


def split_profile(raw: dict, file: Path, sections) -> tuple[dict, dict]:
    """(lakehouse-config overrides, profile keys); anything else is an error naming the key."""
    unknown = sorted(set(raw) - set(sections) - set(PROFILE_KEYS))
    if unknown:
        raise ProfileError(f"{file}: unknown key '{unknown[0]}' (profile keys: {', '.join(PROFILE_KEYS)}; "
                           f"config sections: {', '.join(sections)})")
    return ({k: v for k, v in raw.items() if k in sections},
            {k: v for k, v in raw.items() if k in PROFILE_KEYS})


def env_profile(env: dict[str, str]) -> str:
    return env.get("PROFILE") or DEFAULT_PROFILE


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))
