"""What decides silver's rows, hashed, and the warning when silver starts on other logic.

Every silver commit's lineage carries the hash. A profile whose parsing changed since silver's
last batch (a field declared, a contract changed) is no reason to stop: silver goes on with
today's, as a streaming flow does after its definition changes, and its start says that the
rows before keep the old parsing until `lakehouse refresh silver` reparses bronze."""
from __future__ import annotations

import hashlib
import logging

log = logging.getLogger(__name__)


def logic_hash(cfg) -> str:
    """How the profile parses, keys and joins a record, and silver's time bounds and watermark."""
    p, s = cfg.profile, cfg.silver
    what = (p.parse, p.source, p.silver_table, p.dimension,
            s.min_event_time, s.max_future, s.max_record_bytes, s.dedup_watermark)
    return hashlib.sha256(repr(what).encode()).hexdigest()[:16]


def lineage(cfg) -> dict:
    """The `logic` entry of a silver commit's lineage."""
    return {"profile": cfg.profile.name, "hash": logic_hash(cfg)}


def other_logic(spark, cfg) -> str | None:
    """The hash silver's last batch ran with when it is not today's (after warning), else None.
    Tables written before the lineage carried it say nothing."""
    from common.delta import last_lineage
    from common.storage import is_delta_table

    path = cfg.table_path("silver", cfg.silver_table)
    if not is_delta_table(path):
        return None
    writer, _ = last_lineage(spark, path)
    made_with, today = ((writer or {}).get("logic") or {}).get("hash"), logic_hash(cfg)
    if made_with in (None, today):
        return None
    log.warning(f"silver.{cfg.silver_table}: last written with other parsing than profile "
                f"{cfg.profile.name} gives today (hash {made_with}, today {today}): the records this "
                f"run reads follow today's, the rows before keep the old parsing. Reparse them from "
                f"bronze while the pipeline runs: `lakehouse refresh silver` (make refresh TABLE=silver)")
    return made_with
