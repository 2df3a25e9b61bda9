"""lakehouse refresh silver: recompute silver from bronze's raw records with today's code and
profile, then gold from the refreshed silver, while bronze keeps ingesting.

    lakehouse refresh silver                   # silver's tables, then every gold table
    make refresh TABLE=silver

Why gold follows: gold's rows are folded from silver's, and its checkpoint's offsets point into
the silver table's log; a silver version that replaces rows is one no Delta stream may read on.
So the refresh is a cascade, each step blue/green as `lakehouse refresh gold` (pipeline/refresh.py):

1. Build: the silver flow itself (silver/job.py) runs from the start of bronze into shadow
   tables ($root/silver/_refresh/silver/...: the events table, quarantine, late events, and the
   books it keeps: ops.batch_accounting, ops.new_fields) on a checkpoint of its own, available-
   now, round after round until it has read bronze's latest version. Everything live runs on.
2. Hold gold, then silver: a pipeline process hands each checkpoint over between two batches
   (pipeline/handover.py). One last round reads what bronze gained; then each live silver table
   is overwritten with its shadow's rows in one commit (late events: only the rows silver found
   late, gold's own stay), the shadow's accounting rows are appended to ops.batch_accounting,
   and the shadow checkpoint replaces the live one. Silver goes on at once, from the shadow's
   position, and readers saw the old version or the new one of each table.
3. Gold, still held: `lakehouse refresh gold` builds it from the refreshed silver and switches
   it, then gold goes on from the rebuilt checkpoint. Until then readers read the old gold,
   whole.

The switch commits' lineage names the refresh (id, code, profile, the bronze version covered,
the checkpoint replaced) and the shadow's last batch, with the dimension version each of its
batches joined, so the audit proves the books and the zip codes of the rebuilt rows. A kill is
finished by running the refresh again (the state file says where it stopped); until then a
silver or gold run refuses to start on a half-switched lakehouse and says so.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from pathlib import Path

from common import late
from common.errors import JobError
from common.refreshing import REFRESH, SILVER as QUERY, refresh_folder, refresh_state
from common.storage import is_delta_table
from pipeline import handover
from silver.logic import logic_hash
from pipeline.refresh import (ROUNDS, Target, covered, discard, latest_version, live_lock, made_by,
                              on_local_disk, shadow_lineage, write_state)

log = logging.getLogger("pipeline.refresh")

SHADOWED = (("silver", late.TABLE), ("silver", "quarantine"), ("ops", "new_fields"), ("ops", "batch_accounting"))


class SilverShadow:
    """The configuration the build runs with: the live one, with silver's outputs and its books
    under the refresh's folders, available-now. Bronze, the dimension and ops.dq_results are the
    live ones (the gate's results are real results of the refresh's rows)."""

    shadow = True

    def __init__(self, cfg):
        self._cfg = cfg
        self.checkpoint_root = refresh_folder(cfg, QUERY)
        self.tables_root = Path(str(cfg.root)) / "silver" / REFRESH / QUERY
        self.streaming = dataclasses.replace(cfg.streaming, trigger="available-now")
        self.shadowed = {("silver", cfg.silver_table), *SHADOWED}

    def __getattr__(self, name):
        return getattr(self._cfg, name)

    def table_path(self, layer: str, table: str) -> str:
        live = self._cfg.table_path(layer, table)        # checks the name
        return str(self.tables_root / layer / table) if (layer, table) in self.shadowed else live

    def table_name(self, layer: str, table: str) -> str:
        live = self._cfg.table_name(layer, table)
        return f"{live}__refresh" if (layer, table) in self.shadowed else live

    def checkpoint(self, query: str) -> str:
        return str(self.checkpoint_root / query)


def gold_query(cfg) -> str | None:
    """The live gold query a silver refresh rebuilds (None: gold never ran). Queries of an --only
    selection are refused: their offsets point into the silver being replaced too."""
    root = Path(str(cfg.checkpoint_root))
    others = sorted(p.name for p in root.glob("gold_*") if p.is_dir()) if root.is_dir() else []
    if others:
        raise JobError(f"refresh silver: gold runs as selections with checkpoints of their own "
                       f"({', '.join(others)}, from --only); a silver refresh rebuilds the whole "
                       f"gold query only. Refresh each selection's tables after it, or run gold "
                       f"whole; nothing was changed")
    return "gold" if Path(cfg.checkpoint("gold")).is_dir() else None


def build_round(spark, shadow: SilverShadow) -> None:
    from pipeline.runner import Runner
    from silver.job import layer

    code = Runner(shadow, [layer(shadow)], spark=spark).run()
    if code:
        raise JobError(f"refresh silver: the build failed (exit {code}; its log above says why); the "
                       "live tables are untouched, and running the refresh again resumes it")


def build(spark, cfg, shadow: SilverShadow, rounds: int) -> None:
    bronze = cfg.table_path("bronze", "events")
    for n in range(rounds):
        started = time.monotonic()
        build_round(spark, shadow)
        done, latest = covered(shadow, QUERY), latest_version(spark, bronze)
        log.info(f"refresh silver: build round {n + 1} read bronze through version {done} "
                 f"(latest {latest}) in {time.monotonic() - started:.1f} s")
        if done is not None and done >= latest:
            return


def pins(spark, path: str) -> dict[str, int]:
    """silver_batch_id -> the dimension version that batch joined, from the shadow's commits
    (audit/attribution.py proves the rebuilt rows' zip codes with them)."""
    from delta.tables import DeltaTable

    from common.lineage import parse

    out = {}
    for r in DeltaTable.forPath(spark, path).history().select("userMetadata").collect():
        lineage = parse(r.userMetadata) or {}
        if lineage.get("dimensions") and lineage.get("batch_id") is not None:
            out[str(lineage["batch_id"])] = next(iter(lineage["dimensions"].values()))
    return out


def switch_lineage(spark, cfg, shadow: SilverShadow, state: dict, path: str, table: str) -> dict:
    lineage = shadow_lineage(spark, path, shadow.checkpoint(QUERY), QUERY, "bronze.events")
    refresh = made_by(state, layer="silver", bronze_version=covered(shadow, QUERY))
    if table == cfg.silver_table and cfg.profile.dimension:
        refresh["pins"] = pins(spark, path)
    return {**lineage, "refresh": refresh}


def switch_table(spark, cfg, shadow: SilverShadow, state: dict, layer: str, table: str) -> tuple[str, int] | None:
    """Overwrite (or, for the accounting, append to) one live table with its shadow, in one
    commit keyed by the refresh: a second attempt writes nothing."""
    from common.delta import change_feed, ensure_table
    from common.lineage import to_user_metadata

    source, live = shadow.table_path(layer, table), cfg.table_path(layer, table)
    where = f"late_for = '{QUERY}'" if (layer, table) == ("silver", late.TABLE) else None
    if not is_delta_table(source):
        if where is None or not is_delta_table(live):
            return None          # nothing built, nothing to replace
        rows = spark.read.format("delta").load(live).limit(0)      # no late rows now: remove silver's
    else:
        rows = spark.read.format("delta").load(source)
    if not is_delta_table(live):
        ensure_table(spark, cfg, layer, table, rows.schema, (),
                     change_feed(cfg.silver.change_feed) if layer == "silver" else None)
    append = table == "batch_accounting"
    writer = (rows.write.format("delta").mode("append" if append else "overwrite")
              .option("userMetadata", to_user_metadata(switch_lineage(spark, cfg, shadow, state, source, table)))
              .option("mergeSchema", "true")          # a field the new profile declares: a new column
              .option("txnAppId", f"refresh-{state['id']}-{layer}.{table}").option("txnVersion", 0))
    if where:
        writer = writer.option("replaceWhere", where)
    writer.save(live)
    return f"{layer}.{table}", latest_version(spark, live)


def switch(spark, cfg, shadow: SilverShadow, state: dict) -> list[tuple[str, int]]:
    """Silver's tables, side by side, then the checkpoint. The caller holds the live lock."""
    from common.batch import together
    from common.internals import checkpoint_id

    tables = [("silver", cfg.silver_table), *SHADOWED]
    done = together(*[(lambda t=t: switch_table(spark, cfg, shadow, state, *t)) for t in tables])
    live, built = Path(cfg.checkpoint(QUERY)), Path(shadow.checkpoint(QUERY))
    if built.is_dir():
        if live.is_dir() and checkpoint_id(str(live)) != state["query_id"]:
            live.rename(shadow.checkpoint_root / f"replaced-{checkpoint_id(str(live))}")
        built.rename(live)
    if checkpoint_id(str(live)) != state["query_id"]:
        raise JobError(f"refresh silver: neither {live} nor {built} is the refresh's checkpoint "
                       f"({state['query_id']}); the tables were switched to it. Run `lakehouse "
                       "refresh silver` again to rebuild them")
    return [d for d in done if d is not None]


def release(locks, cfg, query: str) -> None:
    if locks is not None:
        locks.__exit__()
        handover.withdraw(cfg, query)     # the live query (if it handed over) starts on the swap


def refresh_silver(spark, cfg, wait_s: float = 60.0, rounds: int = ROUNDS) -> dict:
    """See the module's doc; returns what it did."""
    from common.internals import checkpoint_id
    from gold.tables import logic_hash as gold_logic
    from pipeline.refresh import refresh

    on_local_disk(cfg)
    bronze = cfg.table_path("bronze", "events")
    if not is_delta_table(bronze):
        raise JobError(f"refresh silver: bronze table {bronze} does not exist yet: nothing to refresh "
                       "silver from (run `make run-bronze` first)")
    gold = gold_query(cfg)
    shadow = SilverShadow(cfg)
    started = time.monotonic()
    state = refresh_state(cfg, QUERY)
    logic = {"profile": cfg.profile.name, "hash": logic_hash(cfg)}
    if state and state.get("phase") == "building" and state.get("logic") != logic:
        log.info("refresh silver: the shadow an earlier refresh left follows other logic; built again")
        discard(shadow)
        state = None
    if state is None:
        state = {"id": uuid.uuid4().hex[:12], "phase": "building", "logic": logic,
                 "code": handover.code_version(), "profile": cfg.profile.name}
        write_state(shadow, state)
    elif state["phase"] != "building":
        log.info(f"refresh silver: finishing refresh {state['id']}, stopped by a kill while {state['phase']}")
    if state["phase"] == "building":
        build(spark, cfg, shadow, rounds)
    built = time.monotonic()
    # Gold first: it must not read a silver version that replaced rows. The request names
    # gold's logic, as a gold refresh's does (the process runs gold by it afterwards).
    ask_gold = {**state, "logic": {"hash": gold_logic(cfg)}}
    gold_locks = live_lock(cfg, Target(gold, (), None), wait_s, ask_gold) if gold else None
    switched = []
    try:
        if state["phase"] in ("building", "switching"):
            silver_locks = live_lock(cfg, Target(QUERY, (), None), wait_s, state)
            try:
                if state["phase"] == "building":
                    done = covered(shadow, QUERY)
                    if done is None or done < latest_version(spark, bronze):
                        build_round(spark, shadow)      # what bronze gained while silver was stopping
                    state = {**state, "phase": "switching", "query_id": checkpoint_id(shadow.checkpoint(QUERY)),
                             "replaced_query_id": checkpoint_id(cfg.checkpoint(QUERY))}
                    write_state(shadow, state)
                switched = switch(spark, cfg, shadow, state)
                state = {**state, "phase": "gold"}
                write_state(shadow, state)
            finally:
                release(silver_locks, cfg, QUERY)
        silver_done = time.monotonic()
        gold_done = refresh(spark, cfg, "gold", wait_s, rounds, held=gold_locks) if gold else None
        discard(shadow)
    finally:
        release(gold_locks, cfg, gold)
    tables = switched + [(f"gold.{t}", v) for t, v in (gold_done or {}).get("tables", [])]
    return {"query": QUERY, "id": state["id"], "tables": tables, "query_id": state["query_id"],
            "gold": gold_done, "build_s": round(built - started, 1),
            "switch_s": round(silver_done - built, 1), "gold_s": round(time.monotonic() - silver_done, 1)}
