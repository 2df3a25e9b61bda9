"""Load, override and validate the lakehouse configuration (conf/lakehouse.yaml).

Every value is checked against the specs below (common.spec) at start-up so a typo fails before
Spark starts, with a message naming the key and the file (or environment variable, or profile)
it came from. The selected profile (common.profile) is loaded with it: a Config always has one.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from pydantic import model_validator

from common import storage
from common.errors import JobError
from common.profile import Profile, ProfileError, deep_merge, expand, load_profile
from common.spec import (AtLeastOne, Bool, Count, Duration, DurationValue, Int, OptDuration, OptStr, Port,
                         PosInt, PosNumber, Rate, Spec, Str, Timestamp, dataclass, invalid, load, one_of,
                         parse_duration, parsed, read_yaml, spec, string)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONF = REPO_ROOT / "conf" / "lakehouse.yaml"

LAYERS = ("bronze", "silver", "gold", "ops")
# Tables every profile has; the profile names its silver event table, its dimension and gold tables.
BRONZE_TABLES = ("events",)
SILVER_TABLES = ("quarantine", "late_events")   # late_events: common/late.py
OPS_TABLES = ("dq_results", "batch_accounting", "query_progress", "new_fields")

# Short names users already know, mapped onto config keys.
ENV_ALIASES = {
    "LAKEHOUSE_ROOT": "paths.lakehouse_root",
    "CHECKPOINT_ROOT": "paths.checkpoint_root",
    "LANDING": "paths.landing",
    "REFERENCE_DIR": "paths.reference",
    "KAFKA_BOOTSTRAP": "kafka.bootstrap_servers",
    "KAFKA_PORT": "kafka.port",
    "KAFKA_DATA_DIR": "kafka.data_dir",
    "SPARK_MASTER": "spark.master",
    "TRIGGER": "streaming.trigger",
    "TRIGGER_INTERVAL": "streaming.trigger_interval",
    "REPORTS_DIR": "paths.reports",
    "SOURCE": "bronze.source",
    "S3_ENDPOINT": "object_store.endpoint",
    "S3_PORT": "object_store.server.port",
}
ENV_PREFIX = "LAKEHOUSE__"


class ConfigError(JobError, ValueError):
    """A configuration value is missing, unknown or malformed."""


def _existing_file(v):
    p = _resolve(string(v), REPO_ROOT)
    if not p.is_file():
        raise ValueError(f"file not found: {p}")
    return p


def _resolve(path: str, base: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return (p if p.is_absolute() else base / p).resolve()


ExistingFile = parsed(Path, _existing_file)   # relative to the repository


# --- conf/lakehouse.yaml, section by section (comments on each key: the file itself) --------

@spec
class SparkConf(Spec):
    master: Str
    local_slots_per_core: PosInt
    app_name: Str
    driver_memory: Str
    page_size: Str
    shuffle_partitions: PosInt
    log_level: Str
    ui_enabled: Bool
    jit: one_of("auto", "c1", "tiered")
    gc: one_of("auto", "parallel", "g1")
    class_archive: Bool
    interpreted_below_rows: Int
    whole_stage_from_rows: Int
    gate_one_task_below_rows: Int


@spec
class PathsConf(Spec):
    lakehouse_root: Str
    checkpoint_root: OptStr
    landing: OptStr
    reference: OptStr
    reports: Str


@spec
class S3ServerConf(Spec):
    port: Port
    data_dir: Str
    bucket: Str
    heap: Str
    start_timeout: DurationValue


@spec
class ObjectStoreConf(Spec):
    endpoint: OptStr
    region: Str
    path_style_access: Bool
    lease_ttl: DurationValue
    lease_settle: DurationValue
    server: S3ServerConf


@spec
class TopicsConf(Spec):
    events: Str
    stats: Str


@spec
class KafkaSourceConf(Spec):
    starting_offsets: Str
    max_offsets_per_trigger: PosInt
    fail_on_data_loss: Bool
    api_timeout: DurationValue
    reconnect_backoff: DurationValue
    reconnect_backoff_max: DurationValue
    max_outage: DurationValue


@spec
class KafkaConf(Spec):
    bootstrap_servers: Str
    port: Port
    controller_port: Port
    data_dir: Str
    broker_heap: Str
    start_timeout: DurationValue
    connect_timeout: DurationValue
    topic_partitions: PosInt
    topics: TopicsConf
    source: KafkaSourceConf


@spec
class StreamingConf(Spec):
    trigger: one_of("available-now", "processing-time")
    trigger_interval: DurationValue
    bronze_interval: OptDuration
    silver_interval: OptDuration
    gold_interval: OptDuration
    stop_timeout: DurationValue
    no_data_batches: Bool


@spec
class BronzeConf(Spec):
    source: one_of("files", "kafka")
    max_files_per_trigger: PosInt
    latest_first: Bool
    subfolders: Bool


@spec
class SilverConf(Spec):
    dedup_watermark: DurationValue
    min_event_time: Timestamp
    max_future: DurationValue
    expectations: ExistingFile
    max_files_per_trigger: PosInt
    max_record_mb: PosInt
    carry_record_kb: Count
    change_feed: Bool

    @property
    def max_record_bytes(self) -> int:
        return self.max_record_mb * 2**20

    @property
    def carry_record_bytes(self) -> int:
        return self.carry_record_kb * 2**10


@spec
class GoldConf(Spec):
    watermark: OptDuration
    windows: dict[str, DurationValue]    # named durations a profile references as $gold.windows.<name>
    stats_to_kafka: Bool
    expectations: ExistingFile
    max_files_per_trigger: PosInt
    change_feed: Bool
    backfill: one_of("on_demand", "auto")   # late events: folded by `lakehouse backfill`, or by gold itself
    backfill_delay: DurationValue           # auto: how long after a late event was found


@spec
class MaintenanceConf(Spec):
    enabled: Bool
    interval: DurationValue
    auto_compact: Bool
    auto_compact_min_files: PosInt
    compact_min_files: PosInt
    audit_horizon: DurationValue
    log_retention: DurationValue
    checkpoint_interval: PosInt
    ops_retention: DurationValue
    min_batches_to_retain: PosInt
    state_maintenance_interval: DurationValue

    @model_validator(mode="after")
    def _log_outlives_audit(self):
        if self.log_retention.seconds < self.audit_horizon.seconds:
            invalid("log_retention", f"{self.log_retention} must be at least 'maintenance.audit_horizon' "
                                     f"({self.audit_horizon}): the audit reads the log")
        return self


@spec
class SoakConf(Spec):
    minutes: PosNumber
    rate: PosInt
    event_time_speedup: PosNumber
    sample_interval: DurationValue
    warmup: DurationValue
    retention: DurationValue
    maintenance_interval: DurationValue
    min_batches_to_retain: PosInt
    growth_limit: PosNumber
    max_files_per_table: PosInt
    out: Str


@spec
class MonitoringConf(Spec):
    progress_flush: DurationValue
    log_batches: Bool


@spec
class GeneratorConf(Spec):
    devices: PosInt
    unknown_devices: Int
    cameras_per_record_max: PosInt
    span: OptDuration
    start: Timestamp
    files: PosInt
    burst_events: AtLeastOne
    burst_gap: DurationValue
    idle_gap: DurationValue
    day_night_factor: PosNumber
    duplicate_rate: Rate
    late_rate: Rate
    max_lateness: DurationValue
    malformed_rate: Rate
    unknown_device_rate: Rate


@spec
class Lakehouse(Spec):
    """conf/lakehouse.yaml, validated."""
    spark: SparkConf
    paths: PathsConf
    object_store: ObjectStoreConf
    kafka: KafkaConf
    streaming: StreamingConf
    bronze: BronzeConf
    silver: SilverConf
    gold: GoldConf
    maintenance: MaintenanceConf
    soak: SoakConf
    monitoring: MonitoringConf
    generator: GeneratorConf


SECTIONS = tuple(Lakehouse.__dataclass_fields__)


@dataclass(frozen=True, eq=False, config={"arbitrary_types_allowed": True})
class Config(Lakehouse):
    """The validated configuration, its profile, and what start-up derives from them."""
    source: Path                       # the config file
    profile: Profile
    # streaming.trigger_interval was given (TRIGGER_INTERVAL, --interval): it beats the per-layer intervals.
    streaming_interval_forced: bool
    store: storage.Store
    # Each is a local Path or an s3a:// ObjectPath (common.storage); both join with `/`.
    root: Any
    checkpoint_root: Any
    landing: Any
    reference: Any
    kafka_data_dir: Path
    tables: dict                       # layer -> table names

    # One rule for every table: $root/<layer>/<table>, registered as <layer>.<table>.
    def table_path(self, layer: str, table: str) -> str:
        _check_table(self.tables, layer, table)
        return str(self.root / layer / table)

    def table_name(self, layer: str, table: str) -> str:
        _check_table(self.tables, layer, table)
        return f"{layer}.{table}"

    @property
    def silver_table(self) -> str:
        """The profile's silver event table (`camera_events` for nest)."""
        return self.profile.silver_table

    def duration(self, value: str) -> Duration:
        """A profile duration: literal ('1 hour') or `$section.key...` of this config, so env
        overrides of that key apply (the nest profile's windows follow gold.windows)."""
        if not value.startswith("$"):
            return parse_duration(value)
        node: Any = self
        for part in value[1:].split("."):
            node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if not isinstance(node, Duration):
            raise ValueError(f"{value!r} does not name a duration key of the config")
        return node

    def checkpoint(self, query: str) -> str:
        return str(self.checkpoint_root / query)

    @property
    def on_object_store(self) -> bool:
        """Whether any lakehouse path is s3a:// (Spark then needs the s3a jars and settings)."""
        return any(isinstance(p, storage.ObjectPath)
                   for p in (self.root, self.checkpoint_root, self.landing, self.reference))

    @property
    def locations_csv(self) -> Path | None:
        """The profile's dimension file under paths.reference (None: the profile has none)."""
        dim = self.profile.dimension
        return self.reference / dim.csv if dim else None


def profile_tables(profile: Profile) -> dict[str, tuple[str, ...]]:
    silver = (profile.silver_table, *SILVER_TABLES) + ((profile.dimension.table,) if profile.dimension else ())
    return {"bronze": BRONZE_TABLES, "silver": silver, "gold": profile.gold_tables, "ops": OPS_TABLES}


def _check_table(tables: dict, layer: str, table: str) -> None:
    if table not in tables.get(layer, ()):
        raise KeyError(f"unknown table {layer}.{table}; known: "
                       + ", ".join(f"{l}.{t}" for l, ts in tables.items() for t in ts))


class Override(NamedTuple):
    """A value for one config key from outside the files, and where it came from (the error
    about a bad one ends with "(value from <origin>)")."""
    value: Any
    origin: str


def env_overrides(env: Mapping[str, str]) -> dict[str, Override]:
    """The config keys the environment sets: the short names (ENV_ALIASES, non-empty values)
    and LAKEHOUSE__SECTION__KEY."""
    found = {key: Override(env[var], f"environment variable {var}")
             for var, key in ENV_ALIASES.items() if env.get(var, "") != ""}
    found.update({var[len(ENV_PREFIX):].lower().replace("__", "."): Override(env[var], f"environment variable {var}")
                  for var in env if var.startswith(ENV_PREFIX)})
    return found


def _apply(raw: dict, overrides: Mapping[str, Any]) -> dict[str, str]:
    """Write overrides (dotted key -> value or Override) into raw; return key -> 'value from
    <origin>'. An unknown key is left to validation, which names it (and the origin)."""
    origin: dict[str, str] = {}
    for key, value in overrides.items():
        if not isinstance(value, Override):
            value = Override(value, f"override '{key}'")
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not leaf:
            raise ConfigError(f"{value.origin}: unknown key '{key}'")
        node[leaf] = value.value
        origin[key] = f"value from {value.origin}"
    return origin


def _derived(spec: Lakehouse, source: Path, profile: Profile) -> dict[str, Any]:
    """Where things are: the store and every lakehouse path, resolved; the profile's tables."""
    o, p = spec.object_store, spec.paths
    store = storage.Store(o.endpoint, o.region, o.path_style_access)

    def where(key: str):
        try:
            return storage.parse(getattr(p, key), Path.cwd(), store)
        except storage.StorageError as e:
            raise ConfigError(f"{source}: key 'paths.{key}': {e}") from None

    root = where("lakehouse_root")
    return dict(store=store, root=root,
                checkpoint_root=where("checkpoint_root") if p.checkpoint_root else root / "_checkpoints",
                landing=where("landing") if p.landing else root / "landing" / profile.name,
                reference=where("reference") if p.reference else root / "reference",
                kafka_data_dir=_resolve(spec.kafka.data_dir, Path.cwd()), tables=profile_tables(profile))


def load_config(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Load conf/lakehouse.yaml (or LAKEHOUSE_CONF, or path) and the profile (PROFILE), merge the
    profile's sections over the file, apply the environment's overrides (env, default os.environ,
    which is only read) and then `overrides` (dotted key -> value, or Override naming where it
    came from, e.g. a command-line flag), validate. Precedence: overrides > env > profile > file."""
    env = dict(os.environ if env is None else env)
    conf_path = Path(path or env.get("LAKEHOUSE_CONF") or DEFAULT_CONF).resolve()
    if not conf_path.is_file():
        raise ConfigError(f"config file not found: {conf_path}")
    raw = read_yaml(conf_path, ConfigError)
    try:
        profile, sections = load_profile(env, REPO_ROOT, SECTIONS)
    except ProfileError as e:
        raise ConfigError(str(e)) from None
    landing = (sections.get("paths") or {}).get("landing")
    if isinstance(landing, str):
        # A profile's landing folder is relative to the repository, wherever make runs from.
        sections["paths"]["landing"] = str(storage.parse(expand(landing), REPO_ROOT))
    from_profile = {f"{section}.{key}": f"value from profile {profile.file}"
                    for section, keys in sections.items() if isinstance(keys, dict) for key in keys}
    raw = deep_merge(raw, sections)
    given = _apply(raw, {**env_overrides(env), **(overrides or {})})
    spec = load(Lakehouse, raw, conf_path, ConfigError, {**from_profile, **given})
    cfg = Config(**{s: getattr(spec, s) for s in SECTIONS}, source=conf_path, profile=profile,
                 streaming_interval_forced="streaming.trigger_interval" in given,
                 **_derived(spec, conf_path, profile))
    if cfg.on_object_store:
        # s3a:// strings (cfg.table_path...) resolve against this store; a config loaded for
        # its defaults alone (local paths) must not reset it.
        storage.set_default_store(cfg.store)
    _check_durations(cfg)
    return cfg


def _check_durations(cfg: Config) -> None:
    """Resolve every duration the profile names now, so a bad one fails before Spark starts."""
    p = cfg.profile
    named = [(f"aggregations[{i}].{k}", getattr(a, k)) for i, a in enumerate(p.aggregations)
             for k in ("window", "slide") if getattr(a, k)]
    for key, value in named + ([("sessions.gap", p.sessions.gap)] if p.sessions else []):
        try:
            cfg.duration(value)
        except ValueError as e:
            raise ConfigError(f"{p.file}: key '{key}': {e}") from None
