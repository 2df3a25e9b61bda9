"""lakehouse refresh: recompute gold from silver (or silver from bronze, then gold) with today's
code and profile, while the pipeline keeps running, and switch readers to it in one commit per
table (blue/green).

    lakehouse refresh gold                     # every table of the gold query
    lakehouse refresh gold.device_sessions     # the query that writes it, with its tables
    lakehouse refresh silver                   # silver from bronze's raw records, then gold
    make refresh TABLE=gold

1. Build, beside the live tables: the gold flow itself (gold/job.py) runs from the start of silver
   into shadow tables ($root/gold/_refresh/<query>/<table>) on a checkpoint of its own
   ($checkpoints/_refresh/<query>/<query>), available-now, round after round until it has read
   silver's latest version. The live gold query keeps running; readers read the live tables.
2. Switch, holding the live gold checkpoint's lock. A pipeline process running gold (run-all,
   run-gold, processing-time) is asked to hand it over between two batches and goes on after
   the switch on the swapped checkpoint, with bronze and silver never stopped
   (pipeline/handover.py); the refresh waits --wait seconds for it, then stops with what to do,
   its shadow kept. One last round reads what silver gained, then each live table is
   overwritten with its shadow's rows in one commit. A reader sees the old version or the new
   one, never an empty or a partial table, and the old one stays readable by time travel until
   retention. The commit's lineage is the shadow's last batch (query id, batch, silver version,
   watermark, the logic's hash) and `refresh` (id, code version, profile, the silver version
   covered, the checkpoint replaced), so gold/owner.py takes the shadow's checkpoint as the
   table's writer and the audit proves the version with the logic that made it. The shadow
   checkpoint then replaces the live one: the next gold run goes on from where the refresh
   stopped, and what silver gains meanwhile is read once, by that run.

A kill at any point is finished by running the refresh again: before the switch it resumes the
build from the shadow's checkpoint (rebuilt from scratch if the profile changed since); during
it, the state file says so, the tables already switched are skipped and the checkpoints are
swapped. Until then a gold run refuses to start (the tables' writer is not its checkpoint) and
says to run the refresh again.

Only one query writes a selection of gold tables, so refreshing one table refreshes the tables
its query writes (every gold table, unless it runs with --only). `refresh silver` is a cascade of
silver's own rebuild and this one (pipeline/refresh_silver.py).
Exit codes: 0 refreshed; 2 something to fix first (an unknown table, no silver, the live gold
query not handed over within --wait).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import time
import uuid
from itertools import combinations
from pathlib import Path

from common.errors import JobError, command
from common.refreshing import REFRESH, refresh_folder, refresh_state
from pipeline import handover

log = logging.getLogger("pipeline.refresh")     # also when run as __main__

STATE = "refresh.json"          # common/refreshing.py reads it too
ROUNDS = 4                     # build rounds before the switch: each reads what silver gained meanwhile


@dataclasses.dataclass(frozen=True)
class Target:
    query: str                 # the gold query whose tables are refreshed
    specs: tuple               # its GoldTables
    only: frozenset | None     # its --only selection (None: every table)


def resolve(cfg, name: str) -> Target:
    """The query and tables `name` (gold, gold.<table>) refreshes; a clear error for anything
    else. Reads no table: bad input is refused before Spark starts."""
    from gold.tables import for_config, query_name

    layer, _, table = name.partition(".")
    tables = for_config(cfg)
    known = ", ".join(["silver", "gold", *(f"gold.{t.table}" for t in tables)])
    if layer == "bronze":
        raise JobError(f"refresh {name}: bronze is the raw record, never recomputed; refresh silver "
                       f"(which rebuilds gold after it) or gold ({known})")
    if layer == "silver":
        from common import late

        made = [cfg.silver_table, "quarantine", late.TABLE]
        if table and table not in made:
            raise JobError(f"refresh {name}: not a table the silver query computes (it writes "
                           f"{', '.join(f'silver.{t}' for t in made)}; silver.device_locations is "
                           f"loaded from a file: `lakehouse locations load`)")
        return Target("silver", (), None)     # one query writes them all: the layer is refreshed
    if layer != "gold" or (table and table not in {t.table for t in tables}):
        raise JobError(f"refresh {name}: unknown table for profile {cfg.profile.name} (known: {known})")
    everything = Target(query_name(cfg, tables), tuple(tables), None)
    if not table:
        return everything
    # The table's query: the --only selection whose checkpoint exists, else the whole profile's.
    for n in range(1, len(tables)):
        for chosen in combinations(tables, n):
            if table in {t.table for t in chosen} and Path(cfg.checkpoint(query_name(cfg, chosen))).is_dir():
                return Target(query_name(cfg, chosen), chosen, frozenset(t.key for t in chosen))
    return everything


class ShadowConfig:
    """The configuration a refresh's build runs with: the live one, with gold's tables and the
    checkpoints under the refresh's folders, available-now, and no stats published (the live
    query publishes what its tables hold)."""

    def __init__(self, cfg, query: str):
        self._cfg = cfg
        self.checkpoint_root = refresh_folder(cfg, query)
        self.tables_root = Path(str(cfg.root)) / "gold" / REFRESH / query
        self.streaming = dataclasses.replace(cfg.streaming, trigger="available-now")
        # No backfill either: the switch installs what the batches made, which the audit proves
        # as such; the live query backfills the late events the build kept again, after it.
        self.gold = dataclasses.replace(cfg.gold, stats_to_kafka=False, backfill="on_demand")

    def __getattr__(self, name):
        return getattr(self._cfg, name)

    def table_path(self, layer: str, table: str) -> str:
        live = self._cfg.table_path(layer, table)        # checks the name
        return str(self.tables_root / table) if layer == "gold" else live

    def table_name(self, layer: str, table: str) -> str:
        live = self._cfg.table_name(layer, table)
        return f"{live}__refresh" if layer == "gold" else live

    def checkpoint(self, query: str) -> str:
        return str(self.checkpoint_root / query)


def write_state(shadow: ShadowConfig, state: dict) -> None:
    """Written whole to a temporary file and renamed: a kill leaves the old state or the new."""
    shadow.checkpoint_root.mkdir(parents=True, exist_ok=True)
    tmp = shadow.checkpoint_root / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(shadow.checkpoint_root / STATE)


def discard(shadow: ShadowConfig) -> None:
    """Remove the shadow tables and checkpoint, and the refresh folders they leave empty."""
    for path in (shadow.tables_root, shadow.checkpoint_root):
        shutil.rmtree(path, ignore_errors=True)
        try:
            path.parent.rmdir()
        except OSError:              # another query's refresh is there, or it is gone already
            pass


def latest_version(spark, path: str) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).history(1).first().version


def covered(shadow: ShadowConfig, query: str) -> int:
    """The silver version the shadow's checkpoint has read through (-1: nothing yet; None: its
    last batch stopped inside a version)."""
    from common.internals import logged_batches, offset_log_entry
    from common.internals import delta_offset_read_through as read_through

    batches = logged_batches(shadow.checkpoint(query))
    if not batches:
        return -1
    _, sources = offset_log_entry(shadow.checkpoint(query), max(batches))
    return read_through(sources[0] if sources else None)


def build_round(spark, shadow: ShadowConfig, target: Target) -> None:
    """One available-now run of the gold flow into the shadow tables."""
    from gold.job import layer
    from pipeline.runner import Runner

    code = Runner(shadow, [layer(shadow, only=target.only)], spark=spark).run()
    if code:
        raise JobError(f"refresh: the build of {target.query} failed (exit {code}; its log above says "
                       "why); the live tables are untouched, and running the refresh again resumes it")


def build(spark, cfg, shadow: ShadowConfig, target: Target, rounds: int = ROUNDS) -> None:
    """Run the shadow until it has read silver's latest version (or `rounds` runs: the switch's
    own last round reads the rest)."""
    silver = cfg.table_path("silver", cfg.silver_table)
    for n in range(rounds):
        started = time.monotonic()
        build_round(spark, shadow, target)
        done, latest = covered(shadow, target.query), latest_version(spark, silver)
        log.info(f"refresh {target.query}: build round {n + 1} read silver through version {done} "
                 f"(latest {latest}) in {time.monotonic() - started:.1f} s")
        if done is not None and done >= latest:
            return


def live_lock(cfg, target: Target, wait_s: float, state: dict):
    """The live gold checkpoint's lock. A gold query running in a pipeline process is asked to
    hand it over between two of its batches (pipeline/handover.py; withdraw the request once
    done); waits up to `wait_s` for it."""
    from common.checkpoint_lock import CheckpointBusy, CheckpointLocks

    query, deadline, asked = target.query, time.monotonic() + wait_s, False
    while True:
        locks = CheckpointLocks(cfg, [query])
        try:
            return locks.__enter__()
        except CheckpointBusy as e:
            if not asked:
                handover.ask(cfg, query, state["id"], state["logic"]["hash"], state["code"], target.only)
                asked = True
                log.info(f"refresh {query}: the live {query} query runs ({e.holder or e}); asked it to "
                         f"hand its checkpoint over after its current batch")
            if time.monotonic() >= deadline:
                handover.withdraw(cfg, query)
                raise JobError(
                    f"refresh {query}: the shadow tables are built and caught up, but the live {query} "
                    f"query did not hand its checkpoint over within {wait_s:.0f} s ({e}). A pipeline "
                    f"process (run-all, run-gold with a processing-time trigger) hands it over between "
                    f"two batches, so its batch is still running or the process does not take "
                    f"requests (an available-now run: let it end). Run the refresh again with more "
                    f"--wait, or stop the process running gold: it resumes from the shadow, reads only "
                    f"what silver gained, and switches.") from None
            time.sleep(0.5)


def shadow_lineage(spark, path: str, checkpoint: str, query: str, upstream: str, **fallback) -> dict:
    """The lineage of the shadow table's last batch (what its rows hold); if no batch wrote the
    table (its upstream held nothing for it yet), the shadow query's last batch, with `fallback`."""
    from common.delta import last_lineage
    from common.internals import logged_batches
    from common.lineage import batch_lineage
    from common.storage import is_delta_table

    lineage = last_lineage(spark, path)[0] if is_delta_table(path) else None
    if lineage is None:
        lineage = {**batch_lineage(checkpoint, query, max(logged_batches(checkpoint)), upstream), **fallback}
    return lineage


def made_by(state: dict, **more) -> dict:
    """What a switch commit's lineage says of the refresh that made it."""
    return {"id": state["id"], "made_by": "lakehouse refresh", **more, "code": state["code"],
            "profile": state["profile"], "logic": state["logic"]["hash"],
            "replaced_query_id": state.get("replaced_query_id")}


def switch_lineage(spark, shadow: ShadowConfig, spec, target: Target, state: dict) -> dict:
    """The switch commit's lineage: the shadow table's last batch, and the refresh that made it."""
    lineage = shadow_lineage(spark, shadow.table_path("gold", spec.table), shadow.checkpoint(target.query),
                             target.query, f"silver.{shadow.silver_table}", logic=state["logic"])
    return {**lineage, "refresh": made_by(state, silver_version=covered(shadow, target.query))}


def switch_table(spark, cfg, shadow: ShadowConfig, target: Target, state: dict, spec, silver_schema) -> int:
    """Overwrite one live table with its shadow, in one commit; returns the live version."""
    from common.delta import change_feed, ensure_table, last_lineage
    from common.lineage import to_user_metadata
    from common.storage import is_delta_table
    from gold.constraints import by_name

    live = cfg.table_path("gold", spec.table)
    if not is_delta_table(live):          # new to the profile: created as a gold run creates it
        ensure_table(spark, cfg, "gold", spec.table, spec.output_schema(spark, silver_schema), (),
                     change_feed(cfg.gold.change_feed), by_name(spec.checks()))
    writer, _ = last_lineage(spark, live)
    if writer is None or writer.get("query_id") != state["query_id"]:    # else switched by a killed run
        (spark.read.format("delta").load(shadow.table_path("gold", spec.table))
         .write.format("delta").mode("overwrite")
         .option("userMetadata", to_user_metadata(switch_lineage(spark, shadow, spec, target, state)))
         # A column the new logic adds comes in the same commit (the next gold start adds the
         # constraints it declares, as for any table).
         .option("mergeSchema", "true")
         # Delta's own replay guard too: a second attempt of this commit writes nothing.
         .option("txnAppId", f"refresh-{state['id']}-{spec.table}").option("txnVersion", 0)
         .save(live))
    return latest_version(spark, live)


def switch(spark, cfg, shadow: ShadowConfig, target: Target, state: dict) -> list[tuple[str, int]]:
    """Overwrite each live table with its shadow (side by side: distinct tables), then put the
    shadow's checkpoint in place of the live one. The caller holds the live checkpoint's lock.
    Returns (table, live version)."""
    from common.batch import together
    from common.internals import checkpoint_id

    new_id = state["query_id"]
    silver_schema = spark.read.format("delta").load(cfg.table_path("silver", cfg.silver_table)).schema
    versions = together(*[(lambda spec=spec: switch_table(spark, cfg, shadow, target, state, spec, silver_schema))
                          for spec in target.specs])
    live_checkpoint, shadow_checkpoint = Path(cfg.checkpoint(target.query)), Path(shadow.checkpoint(target.query))
    if shadow_checkpoint.is_dir():
        if live_checkpoint.is_dir() and checkpoint_id(str(live_checkpoint)) != new_id:
            live_checkpoint.rename(shadow.checkpoint_root / f"replaced-{checkpoint_id(str(live_checkpoint))}")
        shadow_checkpoint.rename(live_checkpoint)
    if checkpoint_id(str(live_checkpoint)) != new_id:
        raise JobError(f"refresh {target.query}: neither {live_checkpoint} nor {shadow_checkpoint} "
                       f"is the refresh's checkpoint ({new_id}); the tables were switched to it. "
                       f"Run `lakehouse refresh gold` again to rebuild them")
    return [(spec.table, v) for spec, v in zip(target.specs, versions)]


def on_local_disk(cfg) -> None:
    from common.storage import ObjectPath, location

    if any(isinstance(location(str(p)), ObjectPath) for p in (cfg.root, cfg.checkpoint_root)):
        raise JobError("refresh on an object store (s3a://) is not supported yet: it renames checkpoint "
                       "folders, which only a local file system does in one step")


def refresh(spark, cfg, name: str, wait_s: float = 60.0, rounds: int = ROUNDS, held=None) -> dict:
    """Refresh `name` (see the module's doc); returns what it did. `held`: the live gold
    checkpoint's lock, already taken (a silver refresh holds it from before silver's switch)."""
    from common.internals import checkpoint_id
    from common.storage import is_delta_table
    from gold.tables import logic_hash

    target = resolve(cfg, name)
    if target.query == "silver":
        from pipeline.refresh_silver import refresh_silver

        return refresh_silver(spark, cfg, wait_s, rounds)
    on_local_disk(cfg)
    silver = cfg.table_path("silver", cfg.silver_table)
    if not is_delta_table(silver):
        raise JobError(f"refresh {name}: silver table {silver} does not exist yet: nothing to refresh "
                       "gold from (run `make run-silver` first)")
    shadow = ShadowConfig(cfg, target.query)
    started = time.monotonic()
    state = refresh_state(cfg, target.query)
    logic = {"profile": cfg.profile.name, "hash": logic_hash(cfg)}
    if state and state.get("phase") != "switching" and (state.get("logic") != logic
                                                         or state.get("tables") != [s.table for s in target.specs]):
        log.info(f"refresh {target.query}: the shadow an earlier refresh left follows other logic or "
                 f"tables; built again")
        discard(shadow)
        state = None
    if state is None:
        state = {"id": uuid.uuid4().hex[:12], "phase": "building", "logic": logic, "code": handover.code_version(),
                 "profile": cfg.profile.name, "tables": [s.table for s in target.specs]}
        write_state(shadow, state)
    elif state["phase"] == "switching":
        log.info(f"refresh {target.query}: finishing the switch of refresh {state['id']}, stopped by a kill")
    if state["phase"] == "building":
        build(spark, cfg, shadow, target, rounds)
    built = time.monotonic()
    locks = held or live_lock(cfg, target, wait_s, state)
    try:
        if state["phase"] == "building":
            done = covered(shadow, target.query)
            if done is None or done < latest_version(spark, silver):
                build_round(spark, shadow, target)   # what silver gained while gold was stopping
            state = {**state, "phase": "switching", "query_id": checkpoint_id(shadow.checkpoint(target.query)),
                     "replaced_query_id": checkpoint_id(cfg.checkpoint(target.query))}
            write_state(shadow, state)
        switched = switch(spark, cfg, shadow, target, state)
        discard(shadow)
    finally:
        if held is None:
            locks.__exit__()
            handover.withdraw(cfg, target.query)    # the live query (if it handed over) starts on the swap
    return {"query": target.query, "id": state["id"], "tables": switched, "query_id": state["query_id"],
            "build_s": round(built - started, 1), "switch_s": round(time.monotonic() - built, 1)}


@command
def main(argv=None, prog: str = "refresh", spark=None) -> int:
    from common.config import load_config
    from common.log import configure

    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", help="gold (every gold table), gold.<table>, or silver (silver's tables, "
                                      "then gold from them)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                        help="how long the switch waits for a running gold query to hand its checkpoint "
                             "over (default 60)")
    args = parser.parse_args(argv)
    configure()
    cfg = load_config()
    resolve(cfg, args.table)               # bad input: refused before Spark starts
    own = spark is None
    if own:
        from common.spark import build_spark

        spark = build_spark(cfg, f"{cfg.spark.app_name}:refresh")
    try:
        done = refresh(spark, cfg, args.table, args.wait)
    finally:
        if own:
            from common.spark import stop

            stop(spark)
    tables = ", ".join(f"{t if '.' in t else 'gold.' + t} (version {v})" for t, v in done["tables"])
    print(f"refreshed {tables}: built in {done['build_s']} s, switched in {done['switch_s']} s; "
          f"{done['query']} now runs on checkpoint {done['query_id']} (refresh {done['id']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
