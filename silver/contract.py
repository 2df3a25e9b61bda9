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
that have an undeclared key; on every other row the cost is the scans and array_except.
"""
from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType, StructField, StructType, VariantType

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


def record_extra(text: Column, profile: Profile) -> Column | None:
    """The record's undeclared top-level keys with their values, `$.`-prefixed; None when the
    contract does not cover that level (or the record is the element: no explode)."""
    if not profile.explode_path or profile.contract.record == "discard":
        return None
    declared = {profile.explode_path[0]} | {k[len(RECORD_PREFIX):] for k in profile.contract.known
                                            if k.startswith(RECORD_PREFIX)}
    keys = F.array_except(F.json_object_keys(text), _names(declared))
    values = F.from_json(text, VALUES)
    return F.when(F.size(keys) > 0, _picked(keys, values, RECORD_PREFIX))


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
    if c.record in by_mode and profile.explode_path:
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


def none() -> dict:
    """The columns of a profile whose contract looks for nothing."""
    return {column: F.lit(None).cast(VALUES) for column in BY_MODE.values()}


def evolved_column(path: str) -> str:
    """The silver column an evolved key becomes: its path, dots as underscores, without `$.`."""
    name = path[len(RECORD_PREFIX):] if path.startswith(RECORD_PREFIX) else path
    return name.replace(".", "_")


def rescued_data(rescued: Column) -> Column:
    return F.to_json(rescued)
