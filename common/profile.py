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
from pathlib import Path

from pydantic import model_validator

from common.spec import (NAME, Bool, Dotted, Measures, Name, Names, Pairs, Spec, Str, Text, invalid, load,
                         one_of, parsed, read_yaml, spec)

from common.errors import JobError

DEFAULT_PROFILE = "nest"
FIELD_TYPES = ("string", "boolean", "long", "double", "timestamp", "json", "present")
TIME_FORMATS = ("iso", "epoch_seconds", "epoch_millis")
# Columns silver adds itself; a declared field or derived column may not take these names.
RESERVED = {"raw", "raw_bytes", "parsed", "reasons", "event_id", "event_time", "event_date", "silver_batch_id",
            "silver_frontier_time", "_rescued_data",
            "batch_id", "quarantined_at", "window_start", "window_end", "finalized"}
# Columns every session row has; a session measure may not take these names.
SESSION_COLUMNS = ("session_id", "session_start", "session_end", "duration_seconds", "events", "status")


class ProfileError(JobError, ValueError):
    """A profile file is missing or declares something the pipeline cannot run."""


@spec
class Field(Spec):
    name: Name
    path: Dotted = ()              # inside the exploded element (or the record); default: the name
    type: one_of(*FIELD_TYPES) = "string"
    required: Bool = False
    format: one_of(*TIME_FORMATS) = "iso"     # timestamps only

    @model_validator(mode="before")
    @classmethod
    def _path_defaults_to_name(cls, raw):
        return {**raw, "path": raw.get("name")} if isinstance(raw, dict) and raw.get("path") is None else raw


@spec
class Source(Spec):
    record: one_of("line", "file") = "line"          # line: one JSON record per line | file: one per file
    compression: one_of("none", "gzip") = "none"


# What silver does with a key the profile does not declare (Auto Loader's schema evolution modes
# and dlt's schema contracts by other names): keep it as JSON in the rescued-data column, grow
# silver by a column for it, stop the batch naming it, or drop it (today's behaviour before
# contracts, Auto Loader's `none`, dlt's `discard_value`).
CONTRACT_MODES = ("rescue", "evolve", "fail", "discard")
RECORD_PREFIX = "$."       # a record-level key's path, outside the exploded element


@spec
class Contract(Spec):
    """The schema contract: per level, what happens to a key the fields do not declare.
    `record`: the record's top level, beside the explode path (a profile without explode has
    no such level: its record is the element); `element`: each exploded element (nest: a
    camera); `nested`: the objects declared fields sit in (nest: last_event). `known`: keys the
    feed is known to carry that silver does not keep, never rescued nor reported (paths as
    rescued data names them: `a.b` inside the element, `$.a` at the record's top level).
    `wrong_type`: an optional field's value of the wrong type quarantines the event
    (wrong_type:<field>, bad_timestamp:<field>) or is kept in the rescued data, the field NULL."""
    record: one_of(*CONTRACT_MODES) = "rescue"
    element: one_of(*CONTRACT_MODES) = "rescue"
    nested: one_of(*CONTRACT_MODES) = "rescue"
    known: parsed(tuple[str, ...], lambda v: tuple(_texts(v))) = ()
    wrong_type: one_of("quarantine", "rescue") = "quarantine"

    def mode(self, level: str) -> str:
        return getattr(self, level)

    @property
    def active(self) -> bool:
        """Whether silver looks for undeclared keys at all."""
        return any(self.mode(lv) != "discard" for lv in ("record", "element", "nested")) \
            or self.wrong_type == "rescue"


def _texts(v):
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in v):
        raise ValueError(f"expected a list of key paths, got {v!r}")
    return v


@spec
class Parse(Spec):
    fields: tuple[Field, ...]
    event_time: Name
    schema: Text | None = None     # raw record schema (Spark DDL); None: derived from the fields
    explode: Dotted | None = None
    index: Name = "element_index"  # column holding the element's position in its record
    key_field: Name | None = None  # a map's key must equal this field (else <field>_mismatch)
    derived: Pairs = ()
    dedup: Names | None = None
    quarantine_columns: Names = ()
    partition: Name = "event_date"
    contract: Contract = Contract()

    @model_validator(mode="after")
    def _consistent(self):
        by_name = {f.name: f for f in self.fields}
        if not self.fields:
            invalid("fields", "declare at least one field")
        names = [f.name for f in self.fields]
        for col in [*names, *(k for k, _ in self.derived)]:
            if col in RESERVED:
                invalid("fields", f"'{col}' is a column silver adds itself; rename the field")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            invalid("fields", f"field '{dupes[0]}' declared twice")
        t = by_name.get(self.event_time)
        if t is None or t.type != "timestamp":
            invalid("event_time", f"'{self.event_time}' must be a declared field of type timestamp")
        if not t.required:
            invalid("event_time", f"field '{self.event_time}' is the event time, so it must be required: true")
        for key in ("dedup", "quarantine_columns", "key_field"):
            value = getattr(self, key)
            for col in (value,) if isinstance(value, str) else value or ():
                if col not in by_name:
                    invalid(key, f"'{col}' is not a declared field")
        if self.key_field and self.explode is None:
            invalid("key_field", "key_field needs an explode over a map")
        return self


@spec
class Dimension(Spec):
    table: Name
    key: Name
    columns: Names
    flag: Name                     # boolean column: no dimension row matched
    csv: Text                      # file name under paths.reference, loaded on first run


@spec
class Publish(Spec):
    key: Names
    value: Name


@spec
class Aggregation(Spec):
    table: Name
    window: Text                   # a duration, or $section.key... of the lakehouse config
    measures: Measures             # (output column, Spark SQL aggregate expression)
    key: Name = ""                 # gold.job --only name; default: the table
    group: Names = ()
    slide: Text | None = None
    publish: Publish | None = None     # gold.stats_to_kafka: key columns and value column

    @model_validator(mode="before")
    @classmethod
    def _key_defaults_to_table(cls, raw):
        return {**raw, "key": raw.get("table")} if isinstance(raw, dict) and raw.get("key") is None else raw

    @model_validator(mode="after")
    def _publishes_a_measure(self):
        if not self.measures:
            invalid("measures", "declare at least one measure")
        if self.publish and self.publish.value not in dict(self.measures):
            invalid("publish", "value", f"'{self.publish.value}' is not one of this table's measures")
        return self

    @property
    def publish_key(self) -> tuple[str, ...] | None:
        return self.publish.key if self.publish else None

    @property
    def publish_value(self) -> str | None:
        return self.publish.value if self.publish else None


@spec
class Sessions(Spec):
    table: Name
    key: Name
    gap: Text
    measures: Measures = ()        # (output column, per-event integer SQL expression)
    latest: Names = ()             # columns whose latest event's value a session keeps

    @model_validator(mode="after")
    def _no_clash(self):
        for m, _ in self.measures:
            if m in (self.key, *SESSION_COLUMNS, *self.latest):
                invalid("measures", f"measure '{m}' clashes with a column every session row has")
        return self


def _table_entries(v):
    """`tables:` entries: mappings naming a `kind` (a module of gold/kinds, which checks the
    entry's other keys) and the `table`."""
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"expected a list, got {v!r}")
    for i, entry in enumerate(v):
        if not isinstance(entry, dict):
            invalid(i, f"must be a mapping, got {entry!r}")
        for k in ("kind", "table"):
            if not NAME.match(str(entry.get(k) or "")):
                invalid(i, k, "missing" if entry.get(k) is None else f"{entry[k]!r} is not a name")
    return tuple(dict(e) for e in v)


@spec
class Profile(Spec):
    name: str
    file: Path
    parse: Parse
    silver_table: Name
    description: Str = ""
    source: Source = Source()
    dimension: Dimension | None = None
    aggregations: tuple[Aggregation, ...] = ()
    sessions: Sessions | None = None
    tables: parsed(tuple[dict, ...], _table_entries) = ()   # gold tables of other kinds (gold/kinds)
    not_keys = ("name", "file")    # given by the loader, not the file

    @model_validator(mode="after")
    def _columns_exist(self):
        columns = self.columns
        if self.dimension and self.dimension.key not in {f.name for f in self.parse.fields}:
            invalid("dimension", "key", f"'{self.dimension.key}' is not a declared field")
        uses = [(("aggregations", i, "group"), a.group) for i, a in enumerate(self.aggregations)]
        if self.sessions:
            uses += [(("sessions", "key"), (self.sessions.key,)), (("sessions", "latest"), self.sessions.latest)]
        for key, cols in uses:
            for col in cols:
                if col not in columns:
                    invalid(*key, f"'{col}' is neither a field, a derived column nor a dimension column")
        tables = list(self.gold_tables)
        dupes = sorted({t for t in tables if tables.count(t) > 1})
        if dupes:
            invalid("aggregations", f"gold table '{dupes[0]}' declared twice")
        keys = ([a.key for a in self.aggregations] + (["sessions"] if self.sessions else [])
                + [t.get("key") or t["table"] for t in self.tables])
        if len(set(keys)) != len(keys):
            invalid("aggregations", "two gold tables share a key")
        return self

    # The parse and source keys, as the layers read them.
    record = property(lambda self: self.source.record)
    compression = property(lambda self: self.source.compression)
    schema = property(lambda self: self.parse.schema)
    explode_path = property(lambda self: self.parse.explode)
    index = property(lambda self: self.parse.index)
    key_field = property(lambda self: self.parse.key_field)
    fields = property(lambda self: self.parse.fields)
    derived = property(lambda self: self.parse.derived)
    event_time = property(lambda self: self.parse.event_time)
    dedup = property(lambda self: self.parse.dedup)
    quarantine_columns = property(lambda self: self.parse.quarantine_columns)
    partition = property(lambda self: self.parse.partition)
    contract = property(lambda self: self.parse.contract)

    @property
    def outputs(self) -> list[str]:
        """Declared fields that become columns (presence checks do not)."""
        return [f.name for f in self.fields if f.type != "present"]

    @property
    def gold_tables(self) -> tuple[str, ...]:
        return (tuple(a.table for a in self.aggregations) + ((self.sessions.table,) if self.sessions else ())
                + tuple(t["table"] for t in self.tables))

    @property
    def columns(self) -> set[str]:
        """Columns of silver's events a gold table may group by: fields, derived, dimension."""
        cols = {f.name for f in self.fields} | {k for k, _ in self.derived}
        return cols | ({*self.dimension.columns, self.dimension.flag} if self.dimension else set())


PROFILE_KEYS = tuple(f for f in Profile.__dataclass_fields__ if f not in Profile.not_keys)


def profiles_dir(env: dict[str, str], repo_root: Path) -> Path:
    return Path(env.get("PROFILES_DIR") or repo_root / "conf" / "profiles")


def read_profile(name: str, directory: Path) -> tuple[Path, dict]:
    if not NAME.match(name or ""):
        raise ProfileError(f"PROFILE={name!r}: a profile name is letters, digits and underscores")
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        raise ProfileError(f"profile {name!r} not found: no {path}"
                           + (f" (known: {', '.join(known)})" if known else ""))
    return path, read_yaml(path, ProfileError)


def load_profile(env: dict[str, str], repo_root: Path, sections) -> tuple[Profile, dict]:
    """The selected profile (PROFILE, in PROFILES_DIR), and the lakehouse-config sections it
    overrides (`sections`: their names)."""
    name = env_profile(env)
    file, raw = read_profile(name, profiles_dir(env, repo_root))
    overrides, own = split_profile(raw, file, sections)
    return load(Profile, {**own, "name": name, "file": file}, file, ProfileError), overrides


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
