"""Load, override and validate the lakehouse configuration (conf/lakehouse.yaml).

Every value is checked against SCHEMA at start-up so a typo fails before Spark starts,
with a message naming the key and the file (or environment variable) it came from.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from common import storage
from common.errors import JobError
from common.profile import (Profile, ProfileError, deep_merge, env_profile, expand, parse_profile,
                            profiles_dir, read_profile, split_profile, yaml_mapping)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONF = REPO_ROOT / "conf" / "lakehouse.yaml"

LAYERS = ("bronze", "silver", "gold", "ops")
# The default (nest) profile's tables; cfg.tables holds the selected profile's.
TABLES = {
    "bronze": ("events",),
    "silver": ("camera_events", "quarantine", "device_locations"),
    "gold": ("zip_hourly_sightings", "device_activity", "device_sessions"),
    "ops": ("dq_results", "batch_accounting", "query_progress"),
}

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


@dataclass(frozen=True)
class Duration:
    seconds: float
    text: str

    def spark(self) -> str:
        """Spark's interval syntax, as withWatermark/window/trigger accept it."""
        ms = int(round(self.seconds * 1000))
        return f"{ms // 1000} seconds" if ms % 1000 == 0 else f"{ms} milliseconds"

    def __str__(self) -> str:
        return self.text


_UNITS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def parse_duration(value: Any) -> Duration:
    m = _DURATION_RE.match(str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad duration {value!r}: expected '<number> <unit>', e.g. '10 minutes'")
    seconds = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if seconds <= 0:
        raise ValueError(f"bad duration {value!r}: must be positive")
    return Duration(seconds, str(value).strip())


# --- value validators: each takes the raw value and returns the typed one ---------------

def _opt_duration(v):
    return None if v is None or str(v).strip().lower() in ("", "null", "none") else parse_duration(v)


def _str(v):
    if isinstance(v, (dict, list)) or v is None:
        raise ValueError(f"expected a string, got {v!r}")
    return str(v)


def _opt_str(v):
    return None if v is None else _str(v)


def _int(v):
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    try:
        return int(str(v))
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None


def _pos_int(v):
    n = _int(v)
    if n <= 0:
        raise ValueError(f"expected a positive integer, got {v!r}")
    return n


def _port(v):
    n = _int(v)
    if not 0 < n < 65536:
        raise ValueError(f"expected a TCP port 1-65535, got {v!r}")
    return n


def _bool(v):
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "yes", "1", "on"):
        return True
    if s in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"expected true/false, got {v!r}")


def _rate(v):
    try:
        r = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"expected a rate between 0 and 1, got {v!r}") from None
    if not 0 <= r <= 1:
        raise ValueError(f"expected a rate between 0 and 1, got {v!r}")
    return r


def _pos_rate(v):
    try:
        r = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"expected a positive number, got {v!r}") from None
    if r <= 0:
        raise ValueError(f"expected a positive number, got {v!r}")
    return r


def _at_least_one(v):
    try:
        r = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number of at least 1, got {v!r}") from None
    if not r >= 1:   # also refuses nan
        raise ValueError(f"expected a number of at least 1, got {v!r}")
    return r


def _timestamp(v):
    try:
        ts = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected an ISO-8601 timestamp, got {v!r}") from None
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def _one_of(*choices):
    def check(v):
        s = _str(v)
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return s
    return check


def _existing_file(v):
    p = _resolve(_str(v), REPO_ROOT)
    if not p.is_file():
        raise ValueError(f"file not found: {p}")
    return p


def _resolve(path: str, base: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return (p if p.is_absolute() else base / p).resolve()


Validator = Callable[[Any], Any]
SCHEMA: dict[str, dict[str, Any]] = {
    "spark": {"master": _str, "app_name": _str, "driver_memory": _str,
              "shuffle_partitions": _pos_int, "log_level": _str, "ui_enabled": _bool,
              "jit": _one_of("auto", "c1", "tiered"), "class_archive": _bool},
    "paths": {"lakehouse_root": _str, "checkpoint_root": _opt_str,
              "landing": _opt_str, "reference": _opt_str, "reports": _str},
    "object_store": {"endpoint": _opt_str, "region": _str, "path_style_access": _bool,
                     "lease_ttl": parse_duration, "lease_settle": parse_duration,
                     "server": {"port": _port, "data_dir": _str, "bucket": _str, "heap": _str,
                                "start_timeout": parse_duration}},
    "kafka": {"bootstrap_servers": _str, "port": _port, "controller_port": _port,
              "data_dir": _str, "broker_heap": _str, "start_timeout": parse_duration,
              "connect_timeout": parse_duration, "topic_partitions": _pos_int,
              "topics": {"events": _str, "stats": _str},
              "source": {"starting_offsets": _str, "max_offsets_per_trigger": _pos_int,
                         "fail_on_data_loss": _bool, "api_timeout": parse_duration,
                         "reconnect_backoff": parse_duration, "reconnect_backoff_max": parse_duration,
                         "max_outage": parse_duration}},
    "streaming": {"trigger": _one_of("available-now", "processing-time"),
                  "trigger_interval": parse_duration, "bronze_interval": _opt_duration,
                  "silver_interval": _opt_duration, "gold_interval": _opt_duration,
                  "stop_timeout": parse_duration},
    "bronze": {"source": _one_of("files", "kafka"), "max_files_per_trigger": _pos_int,
               "latest_first": _bool},
    "silver": {"dedup_watermark": parse_duration, "min_event_time": _timestamp,
               "max_future": parse_duration, "expectations": _existing_file,
               "max_files_per_trigger": _pos_int},
    "gold": {"watermark": _opt_duration, "sightings_window": parse_duration,
             "activity_window": parse_duration, "activity_slide": parse_duration,
             "session_gap": parse_duration, "stats_to_kafka": _bool,
             "expectations": _existing_file, "max_files_per_trigger": _pos_int},
    "maintenance": {"enabled": _bool, "interval": parse_duration, "auto_compact": _bool,
                    "auto_compact_min_files": _pos_int, "compact_min_files": _pos_int,
                    "audit_horizon": parse_duration,
                    "log_retention": parse_duration, "checkpoint_interval": _pos_int,
                    "ops_retention": parse_duration, "min_batches_to_retain": _pos_int},
    "soak": {"minutes": _pos_rate, "rate": _pos_int, "event_time_speedup": _pos_rate,
             "sample_interval": parse_duration, "warmup": parse_duration, "retention": parse_duration,
             "maintenance_interval": parse_duration, "min_batches_to_retain": _pos_int,
             "growth_limit": _pos_rate,
             "max_files_per_table": _pos_int, "out": _str},
    "monitoring": {"progress_flush": parse_duration, "log_batches": _bool},
    "generator": {"devices": _pos_int, "unknown_devices": _int, "cameras_per_record_max": _pos_int,
                  "span": _opt_duration, "start": _timestamp, "files": _pos_int,
                  "burst_events": _at_least_one, "burst_gap": parse_duration, "idle_gap": parse_duration,
                  "day_night_factor": _pos_rate,
                  "duplicate_rate": _rate, "late_rate": _rate, "max_lateness": parse_duration,
                  "malformed_rate": _rate, "unknown_device_rate": _rate},
}


class Section:
    """Read-only attribute view over one validated section of the config."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"Section({self.__dict__!r})"


class Config:
    def __init__(self, values: dict[str, Any], source: Path, profile: Profile | None = None):
        self.source = source
        self.profile = profile
        self.tables = profile_tables(profile) if profile else TABLES
        for name, value in values.items():
            setattr(self, name, _sectionize(value))
        o = values["object_store"]
        self.store = storage.Store(o["endpoint"], o["region"], o["path_style_access"])
        p = values["paths"]

        def where(key: str):
            try:
                return storage.parse(p[key], Path.cwd(), self.store)
            except storage.StorageError as e:
                raise ConfigError(f"{source}: key 'paths.{key}': {e}") from None

        # Each is a local Path or an s3a:// ObjectPath (common.storage); both join with `/`.
        root = where("lakehouse_root")
        self.root = root
        self.checkpoint_root = where("checkpoint_root") if p["checkpoint_root"] else root / "_checkpoints"
        self.landing = where("landing") if p["landing"] else root / "landing" / "nest"
        self.reference = where("reference") if p["reference"] else root / "reference"
        if self.on_object_store:
            # s3a:// strings (cfg.table_path...) resolve against this store; a config loaded for
            # its defaults alone (local paths) must not reset it.
            storage.set_default_store(self.store)
        self.kafka_data_dir = _resolve(values["kafka"]["data_dir"], Path.cwd())

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
        return self.profile.silver_table if self.profile else "camera_events"

    def duration(self, value: str) -> Duration:
        """A profile duration: literal ('1 hour') or `$section.key` of this config, so env
        overrides of that key apply (the nest profile's windows follow gold.sightings_window)."""
        if value.startswith("$"):
            node: Any = self
            for part in value[1:].split("."):
                node = getattr(node, part, None)
            if not isinstance(node, Duration):
                raise ConfigError(f"{self.profile.file if self.profile else self.source}: "
                                  f"{value!r} does not name a duration key of the config")
            return node
        try:
            return parse_duration(value)
        except ValueError as e:
            raise ConfigError(f"{self.profile.file if self.profile else self.source}: {e}") from None

    def checkpoint(self, query: str) -> str:
        return str(self.checkpoint_root / query)

    @property
    def on_object_store(self) -> bool:
        """Whether any lakehouse path is s3a:// (Spark then needs the s3a jars and settings)."""
        return any(isinstance(p, storage.ObjectPath)
                   for p in (self.root, self.checkpoint_root, self.landing, self.reference))

    @property
    def locations_csv(self) -> Path:
        dim = self.profile.dimension if self.profile else None
        return self.reference / (dim.csv if dim else "device_locations.csv")


def profile_tables(profile: Profile) -> dict[str, tuple[str, ...]]:
    silver = (profile.silver_table, "quarantine") + ((profile.dimension.table,) if profile.dimension else ())
    return {"bronze": TABLES["bronze"], "silver": silver, "gold": profile.gold_tables, "ops": TABLES["ops"]}


def _check_table(tables: dict, layer: str, table: str) -> None:
    if table not in tables.get(layer, ()):
        raise KeyError(f"unknown table {layer}.{table}; known: "
                       + ", ".join(f"{l}.{t}" for l, ts in tables.items() for t in ts))


def _sectionize(value):
    if isinstance(value, dict):
        return Section({k: _sectionize(v) for k, v in value.items()})
    return value


def _validate(raw: Any, schema: dict, where: str, prefix: str = "") -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: '{prefix.rstrip('.') or '<top>'}' must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(f"{where}: unknown key '{prefix}{unknown[0]}' "
                          f"(known under '{prefix.rstrip('.') or '<top>'}': {', '.join(sorted(schema))})")
    out = {}
    for key, rule in schema.items():
        full = prefix + key
        if key not in raw:
            raise ConfigError(f"{where}: missing key '{full}'")
        if isinstance(rule, dict):
            out[key] = _validate(raw[key], rule, where, full + ".")
        else:
            try:
                out[key] = rule(raw[key])
            except ValueError as e:
                raise ConfigError(f"{where}: key '{full}': {e}") from None
    return out


def _apply_env(raw: dict, env: dict[str, str]) -> dict[str, str]:
    """Write environment overrides into raw; return key -> variable name, for error messages."""
    origin: dict[str, str] = {}
    pairs = [(var, key) for var, key in ENV_ALIASES.items() if env.get(var, "") != ""]
    pairs += [(var, var[len(ENV_PREFIX):].lower().replace("__", "."))
              for var in env if var.startswith(ENV_PREFIX)]
    for var, key in pairs:
        *parents, leaf = key.split(".")
        node, schema = raw, SCHEMA
        for part in parents:
            if not isinstance(schema.get(part), dict):
                raise ConfigError(f"environment variable {var}: unknown key '{key}'")
            schema = schema[part]
            node = node.setdefault(part, {})
        if leaf not in schema or isinstance(schema[leaf], dict):
            raise ConfigError(f"environment variable {var}: unknown key '{key}'")
        node[leaf] = env[var]
        origin[key] = var
    return origin


def load_config(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Config:
    """Load conf/lakehouse.yaml (or LAKEHOUSE_CONF, or path), apply env overrides, validate."""
    env = dict(os.environ if env is None else env)
    conf_path = Path(path or env.get("LAKEHOUSE_CONF") or DEFAULT_CONF).resolve()
    if not conf_path.is_file():
        raise ConfigError(f"config file not found: {conf_path}")
    raw = yaml_mapping(conf_path, ConfigError)
    try:
        profile_file, profile_raw = read_profile(env_profile(env), profiles_dir(env, REPO_ROOT))
        overrides, own = split_profile(profile_raw, profile_file, SCHEMA)
        profile = parse_profile(env_profile(env), profile_file, own)
    except ProfileError as e:
        raise ConfigError(str(e)) from None
    landing = (overrides.get("paths") or {}).get("landing")
    if isinstance(landing, str):
        # A profile's landing folder is relative to the repository, wherever make runs from.
        overrides["paths"]["landing"] = str(storage.parse(expand(landing), REPO_ROOT))
    from_profile = {f"{section}.{key}" for section, keys in overrides.items()
                    if isinstance(keys, dict) for key in keys}
    raw = deep_merge(raw, overrides)
    origin = _apply_env(raw, env)
    try:
        values = _validate(raw, SCHEMA, str(conf_path))
    except ConfigError as e:
        # Name the variable too when the bad value came from the environment.
        for key, var in origin.items():
            if f"'{key}'" in str(e):
                raise ConfigError(f"{e} (value from environment variable {var})") from None
        for key in from_profile:
            if f"'{key}" in str(e):
                raise ConfigError(f"{e} (value from profile {profile_file})") from None
        raise
    m = values["maintenance"]
    if m["log_retention"].seconds < m["audit_horizon"].seconds:
        raise ConfigError(f"{conf_path}: key 'maintenance.log_retention' ({m['log_retention']}) must be at "
                          f"least 'maintenance.audit_horizon' ({m['audit_horizon']}): the audit reads the log")
    cfg = Config(values, conf_path, profile)
    # Resolve every duration the profile names now, so a bad one fails before Spark starts.
    for agg in profile.aggregations:
        cfg.duration(agg.window)
        if agg.slide:
            cfg.duration(agg.slide)
    if profile.sessions:
        cfg.duration(profile.sessions.gap)
    # An interval given on the command line or in TRIGGER_INTERVAL beats the per-layer ones.
    cfg.streaming_interval_forced = "streaming.trigger_interval" in origin
    return cfg
