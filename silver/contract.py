"""The profile's schema contract (common/profile.py Contract) as silver's columns: which keys of a
record the profile does not declare, and where each goes (rescued data, a new column, a failed
batch). Pure Column expressions; silver/transform.py places them in its parse.

Finding undeclared keys reads each level the contract covers once more, as a map of key ->
VARIANT (the value's exact JSON), and subtracts the declared names:
- the element (nest: a camera): a second from_json of the record with the elements as maps,
  exploded beside the typed elements (never copied onto another element's row);
- the objects declared fields sit in (nest: last_event): cast from the element's map value;
- the record's top level: json_object_keys (a scan, no values built), the values parsed only
  for a record that has an undeclared key.
The map filters (higher-order functions, row by row outside generated code) run only on rows
that have an undeclared key.

All of that runs only for a record that may have an undeclared key: silver_undeclared_keys
(jvm/silver-keys, a Java function built at setup) says so in one streaming scan of the text that
builds no value and stops at the first such key. The second read cost 6-10 of the ~20 CPU
seconds of silver's parse of 200,000 events, the scan under 1. A contract that rescues values of
the wrong type needs every element's map, and reads every record twice as before.
"""
from __future__ import annotations

import json

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, MapType, StringType, StructField, StructType, VariantType

from common.jars import register_java_function
from common.profile import RECORD_PREFIX, Profile

KEYS = "_k"                   # the record parsed again, each element as a map of key -> VARIANT
RECORD_EXTRA = "_record_extra"   # the record's undeclared top-level keys ($.name -> value)
ELEMENT_MAP = "_element_map"     # one element's map, beside its typed struct
# What each contract mode collects per event: path -> value, NULL when nothing.
RESCUED, EVOLVED, VIOLATIONS = "_rescued", "_evolved", "_violations"
BY_MODE = {"rescue": RESCUED, "evolve": EVOLVED, "fail": VIOLATIONS}
RESCUED_DATA = "_rescued_data"   # silver's column: the rescued map as a JSON object
VALUES = MapType(StringType(), VariantType())


def active(profile: Profile) -> bool:
    return profile.contract.active


def keys_schema(profile: Profile, is_map: bool) -> StructType | MapType:
    """from_json's schema for the second read: down the explode path, the elements as maps."""
    if not profile.explode_path:
        return VALUES
    dtype = MapType(StringType(), VALUES) if is_map else ArrayType(VALUES)
    for part in reversed(profile.explode_path):
        dtype = StructType([StructField(part, dtype)])
    return dtype


def _record_declared(profile: Profile) -> set[str]:
    return {profile.explode_path[0]} | {k[len(RECORD_PREFIX):] for k in profile.contract.known
                                        if k.startswith(RECORD_PREFIX)}


def record_extra(text: Column, profile: Profile) -> Column | None:
    """The record's undeclared top-level keys with their values, `$.`-prefixed; None when the
    contract does not cover that level (or the record is the element: no explode)."""
    if not profile.explode_path or profile.contract.record == "discard":
        return None
    keys = F.array_except(F.json_object_keys(text), _names(_record_declared(profile)))
    values = F.from_json(text, VALUES)
    return F.when(F.size(keys) > 0, _picked(keys, values, RECORD_PREFIX))


UNDECLARED = "silver_undeclared_keys"
_UNDECLARED_CLASS = "silverkeys.UndeclaredKeys"


def scan_spec(profile: Profile) -> str | None:
    """The levels silver_undeclared_keys checks, as its spec (jvm/silver-keys): a node per level
    with its declared keys (none: not checked), the levels below it to walk, and `items` for
    the collection the explode path ends at. None when the scan cannot stand in for the second
    read (a contract that rescues wrong types needs every element's map)."""
    c = profile.contract
    if c.wrong_type == "rescue":
        return None
    element: dict = {"children": {}}
    if c.element != "discard":
        element["keys"] = sorted(_children(profile, ()))
    if c.nested != "discard":
        for parent in parents(profile):      # outermost first: each one's parent is already there
            node = element
            for part in parent:
                node = node["children"].setdefault(part, {"children": {}})
            node["keys"] = sorted(_children(profile, parent))
    root = element
    if profile.explode_path:
        root = node = {"children": {}}
        if c.record != "discard":
            root["keys"] = sorted(_record_declared(profile))
        for part in profile.explode_path:
            node = node["children"].setdefault(part, {"children": {}})
        node["items"] = element
    return json.dumps(root, sort_keys=True)


def may_have_undeclared(text: Column, profile: Profile, spark) -> Column | None:
    """True for a record that may have a key the contract does not declare (never false for one
    that has); None when every record must be read again (scan_spec)."""
    spec = scan_spec(profile)
    if spec is None:
        return None
    register_java_function(spark, UNDECLARED, _UNDECLARED_CLASS, BooleanType(), "silver-keys")
    return F.call_function(UNDECLARED, text.cast("binary"), F.lit(spec.encode()))


def _names(names) -> Column:
    return F.array(*[F.lit(n) for n in sorted(names)]).cast("array<string>")


def _picked(keys: Column, values: Column, prefix: str) -> Column:
    kept = F.map_filter(values, lambda k, _: F.array_contains(keys, k))
    return F.transform_keys(kept, lambda k, _: F.concat(F.lit(prefix), k)) if prefix else kept


def _union(maps: list[Column]) -> Column:
    if not maps:
        return F.lit(None).cast(VALUES)
    if len(maps) == 1:
        return maps[0]
    both = F.map_concat(*[F.coalesce(m, F.create_map().cast(VALUES)) for m in maps])
    return F.when(F.size(both) > 0, both)


def _variant_path(parts) -> str:
    return "$" + "".join(f"['{p}']" for p in parts)


def value_at(element: Column, path: tuple[str, ...]) -> Column:
    """The JSON value at a field's path inside an element's map, as VARIANT."""
    head = element[path[0]]
    return F.try_variant_get(head, _variant_path(path[1:]), "variant") if len(path) > 1 else head


def parents(profile: Profile) -> list[tuple[str, ...]]:
    """The objects declared fields sit in, outermost first (nest: last_event)."""
    return list(dict.fromkeys(f.path[:k] for f in profile.fields for k in range(1, len(f.path))))


def _children(profile: Profile, parent: tuple[str, ...]) -> set[str]:
    n = len(parent)
    declared = {f.path[n] for f in profile.fields if f.path[:n] == parent and len(f.path) > n}
    prefix = ".".join(parent) + "." if parent else ""
    known = {k[len(prefix):] for k in profile.contract.known if not k.startswith(RECORD_PREFIX)
             and k.startswith(prefix) and "." not in k[len(prefix):]}
    return declared | known


def level_of(profile: Profile, path: str) -> str:
    """The contract level an undeclared key's path belongs to."""
    if path.startswith(RECORD_PREFIX):
        return "record"
    return "nested" if any(path.startswith(".".join(p) + ".") for p in parents(profile)) else "element"


def event_columns(profile: Profile, element: Column, wrong_types: list[tuple[Column, tuple[str, ...]]]) -> dict:
    """RESCUED, EVOLVED, VIOLATIONS of one element's row, from its map (`element`) and its
    record's RECORD_EXTRA. `wrong_types`: (a value of the wrong type is there, field path) of
    the optional fields, rescued when the contract says so."""
    c = profile.contract
    by_mode: dict[str, list[Column]] = {m: [] for m in BY_MODE}
    record_extra = c.record in by_mode and profile.explode_path     # the record's keys reach its events
    if record_extra:
        by_mode[c.record].append(F.col(RECORD_EXTRA))
    if c.element in by_mode:
        keys = F.array_except(F.map_keys(element), _names(_children(profile, ())))
        by_mode[c.element].append(F.when(F.size(keys) > 0, _picked(keys, element, "")))
    if c.nested in by_mode:
        for parent in parents(profile):
            values = F.try_variant_get(element[parent[0]], _variant_path(parent[1:]), "map<string,variant>")
            keys = F.array_except(F.map_keys(values), _names(_children(profile, parent)))
            by_mode[c.nested].append(F.when(F.size(keys) > 0, _picked(keys, values, ".".join(parent) + ".")))
    if c.wrong_type == "rescue":
        by_mode["rescue"] += [F.when(bad, F.create_map(F.lit(".".join(path)), value_at(element, path)))
                              for bad, path in wrong_types]
        return {column: _union(by_mode[mode]) for mode, column in BY_MODE.items()}
    # Then every column is a function of the element's map and the record's extra keys alone,
    # NULL when both are: an event of a record the scan let through unread (nearly all) skips
    # their map and array work (0.2-0.3 of the 9 core-s of a 200,000-event parse).
    found = element.isNotNull()
    if record_extra:
        found = found | F.col(RECORD_EXTRA).isNotNull()
    return {column: F.when(found, _union(by_mode[mode])) for mode, column in BY_MODE.items()}


def none() -> dict:
    """The columns of a profile whose contract looks for nothing."""
    return {column: F.lit(None).cast(VALUES) for column in BY_MODE.values()}


def evolved_column(path: str) -> str:
    """The silver column an evolved key becomes: its path, dots as underscores, without `$.`."""
    name = path[len(RECORD_PREFIX):] if path.startswith(RECORD_PREFIX) else path
    return name.replace(".", "_")


def rescued_data(rescued: Column) -> Column:
    return F.to_json(rescued)
