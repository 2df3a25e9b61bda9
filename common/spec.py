"""One way to read the project's YAML into frozen, typed specs: conf/lakehouse.yaml (common.config),
conf/profiles/*.yaml (common.profile) and conf/expectations/*.yaml (common.quality).

A spec is a class under `@spec`: its annotations say what each key holds, the annotated types
below say how a YAML value becomes one (and what to say when it cannot), defaults make a key
optional (a null value takes the default), and a check across keys is a
`@model_validator(mode="after")` method that calls `invalid(key..., message)`. `load()` validates
a mapping and turns the first problem into one sentence naming the file and the dotted key,
plus where an overriding value came from:

    conf/profiles/p.yaml: key 'parse.fields[0].type': expected one of string, boolean, ... got 'date'
    conf/lakehouse.yaml: key 'streaming.trigger_interval': bad duration 'soon': ... (value from
    environment variable TRIGGER_INTERVAL)

Built on pydantic (v2): it walks nested mappings and lists, tracks every key's position and
refuses unknown keys, which three hand-written readers (a SCHEMA of validator functions, a
_Reader class, a suite parser) each did their own way before. Pydantic *dataclasses* rather than
BaseModel: they stay dataclasses (positional construction, as in Rule(...)) and bring no model
namespace, so a key may be called `schema`. The scalar types are our own validators, not
pydantic's coercions, so values read as before ('10 minutes', 'yes', a port given as text in
an environment variable) and the messages stay ours.
"""
from __future__ import annotations

import re
from dataclasses import dataclass as std_dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Callable

import yaml
from pydantic import ConfigDict, PlainValidator, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Invalid(ValueError):
    """A check across keys failed: `key` is the offending key, below the spec that raised it."""

    def __init__(self, key: tuple, message: str):
        super().__init__(message)
        self.key = key


def invalid(*key_and_message):
    *key, message = key_and_message
    raise Invalid(tuple(key), message)


class Spec:
    """Base of every spec. What each checks first: a mapping, of known keys (`not_keys`: fields
    the loader fills in, not the file); a null value takes the key's default."""

    not_keys: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _mapping_of_known_keys(cls, raw):
        if isinstance(raw, (cls, ArgsKwargs)):          # built in code: Rule(...), or already one
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"must be a mapping, got {raw!r}")
        known = [f.name for f in dataclass_fields(cls) if f.name not in cls.not_keys]
        unknown = sorted(set(map(str, raw)) - set(known) - set(cls.not_keys))
        if unknown:
            invalid(unknown[0], f"unknown key (known: {', '.join(known)})")
        required = {n for n, f in cls.__pydantic_fields__.items() if f.is_required()}
        return {k: v for k, v in raw.items() if v is not None or k in required}


# `@spec class X(Spec)`: a frozen dataclass, validated on construction.
spec = dataclass(frozen=True, config=ConfigDict(extra="forbid", arbitrary_types_allowed=True))


def load(cls, raw: Any, where: Any, error: type[Exception], origins: dict[str, str] | None = None,
         context: dict | None = None):
    """raw validated into cls, or `error` naming the file (where), the key and, when the key's
    value came from elsewhere, its origin ({key prefix: 'value from ...'}). `context` reaches the
    validators (pydantic's ValidationInfo.context)."""
    try:
        return cls.__pydantic_validator__.validate_python(raw, context=context)
    except ValidationError as e:
        key, message = _describe(e.errors()[0])
        origin = next((o for k, o in (origins or {}).items()
                       if key == k or key.startswith((k + ".", k + "["))), None)
        raise error(f"{where}: key '{key}': {message}" + (f" ({origin})" if origin else "")) from None


def _describe(err: dict) -> tuple[str, str]:
    loc, kind, cause = err["loc"], err["type"], (err.get("ctx") or {}).get("error")
    if isinstance(cause, Invalid):
        loc = loc + cause.key
    if isinstance(cause, ValueError):
        message = str(cause)
    elif kind == "missing":
        message = "missing"
    else:
        expected = {"tuple_type": "a list", "list_type": "a list", "dict_type": "a mapping"}.get(kind)
        message = f"expected {expected}, got {err['input']!r}" if expected else f"{err['msg']}, got {err['input']!r}"
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return key or "<top>", message


def read_yaml(path: Path, error: type[Exception]) -> dict:
    """A YAML file whose top level is a mapping (empty file: {}); anything else raises `error`
    naming the file."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise error(f"{path}: cannot read: {e}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: top level must be a mapping")
    return raw


# --- value types: Annotated[<python type>, how a YAML value becomes one] ----------------------

def parsed(kind: Any, fn: Callable[[Any], Any]) -> Any:
    return Annotated[kind, PlainValidator(fn)]


_UNITS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}


@std_dataclass(frozen=True)
class Duration:
    seconds: float
    text: str

    def spark(self) -> str:
        """Spark's interval syntax, as withWatermark/window/trigger accept it."""
        ms = int(round(self.seconds * 1000))
        return f"{ms // 1000} seconds" if ms % 1000 == 0 else f"{ms} milliseconds"

    def __str__(self) -> str:
        return self.text


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def parse_duration(value: Any) -> Duration:
    m = _DURATION.match(str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad duration {value!r}: expected '<number> <unit>', e.g. '10 minutes'")
    seconds = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if seconds <= 0:
        raise ValueError(f"bad duration {value!r}: must be positive")
    return Duration(seconds, str(value).strip())


def string(v):
    if isinstance(v, (dict, list)) or v is None:
        raise ValueError(f"expected a string, got {v!r}")
    return str(v)


def _text(v):
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or not str(v).strip():
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return str(v)


def _int(v):
    try:
        if isinstance(v, bool):
            raise ValueError
        return int(str(v))
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None


def _number(v, what: str, ok: Callable[[float], bool]):
    try:
        r = float(v)
    except (TypeError, ValueError):
        r = float("nan")
    if not ok(r):   # nan fails every comparison
        raise ValueError(f"expected {what}, got {v!r}")
    return r


def _bool(v):
    s = str(v).strip().lower()
    if isinstance(v, bool) or s in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return v if isinstance(v, bool) else s in ("true", "yes", "1", "on")
    raise ValueError(f"expected true/false, got {v!r}")


def _timestamp(v):
    try:
        ts = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected an ISO-8601 timestamp, got {v!r}") from None
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def _limited(check: Callable, ok: Callable[[Any], bool], what: str):
    def limit(v):
        n = check(v)
        if not ok(n):
            raise ValueError(f"expected {what}, got {v!r}")
        return n
    return limit


def one_of(*choices: str) -> Any:
    def check(v):
        if string(v) not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v
    return parsed(str, check)


def _name(v):
    if not NAME.match(_text(v)):
        raise ValueError(f"{v!r} is not a column/table name (letters, digits, underscores)")
    return v


def _names(v):
    if not isinstance(v, (list, tuple, str)):
        raise ValueError(f"expected a list or a non-empty string, got {v!r}")
    for item in [v] if isinstance(v, str) else v:
        if not isinstance(item, str) or not NAME.match(item):
            raise ValueError(f"{item!r} is not a column name")
    return (v,) if isinstance(v, str) else tuple(v)


def _pairs(names: bool):
    def check(v):
        if not isinstance(v, dict):
            raise ValueError(f"expected a mapping, got {v!r}")
        for k in v if names else ():
            if not NAME.match(str(k)):
                raise ValueError(f"{k!r} is not a column name")
        return tuple((str(k), str(x)) for k, x in v.items())
    return check


Str = parsed(str, string)                    # any scalar, as text
OptStr = parsed(str | None, lambda v: None if v is None else string(v))
Text = parsed(str, _text)                    # a non-empty string
Int = parsed(int, _int)
PosInt = parsed(int, _limited(_int, lambda n: n > 0, "a positive integer"))
Count = parsed(int, _limited(_int, lambda n: n >= 0, "an integer of at least 0"))
Port = parsed(int, _limited(_int, lambda n: 0 < n < 65536, "a TCP port 1-65535"))
Bool = parsed(bool, _bool)
Rate = parsed(float, lambda v: _number(v, "a rate between 0 and 1", lambda r: 0 <= r <= 1))
PosNumber = parsed(float, lambda v: _number(v, "a positive number", lambda r: r > 0))
AtLeastOne = parsed(float, lambda v: _number(v, "a number of at least 1", lambda r: r >= 1))
Timestamp = parsed(datetime, _timestamp)
DurationValue = parsed(Duration, parse_duration)
OptDuration = parsed(Duration | None, lambda v: None if str(v).strip().lower() in ("", "null", "none")
                     else parse_duration(v))
Name = parsed(str, _name)                    # a column or table name
Names = parsed(tuple[str, ...], _names)      # a list of names, or one
Dotted = parsed(tuple[str, ...], lambda v: tuple(_text(v).split(".")))   # a.b.c -> (a, b, c)
Pairs = parsed(tuple[tuple[str, str], ...], _pairs(names=False))          # {k: v} -> ((k, v), ...)
Measures = parsed(tuple[tuple[str, str], ...], _pairs(names=True))        # ... keys being names
