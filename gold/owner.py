"""Which streaming query may write a gold table, and when a table cannot join one.

A window's row is the sum of every batch its query folded in, so a table has one writer: the
checkpoint whose batches built it. Another query (a deleted checkpoint, another --only
selection) would read silver from its start and count every event again; rows changed by hand
since the query's last batch (a RESTORE) no longer hold what it folded in; and a table added
to the profile after the query has run would begin at silver's current position and silently
miss its history.

A profile changed since a table's last batch (a session gap, a window) is no reason to refuse:
the query goes on with today's logic, as a streaming flow does after its definition changes,
and says which tables still hold rows of the old one."""
from __future__ import annotations

import logging

from common.errors import JobError
from common.delta import last_lineage
from common.internals import checkpoint_id
from common.lineage import last_logged_batch
from common.refreshing import check_not_switching, refresh_folder, refresh_state
from common.storage import is_delta_table


def check_owner(spark, cfg, query: str, tables) -> dict[str, str]:
    """Refuse to start a query whose batches would make a table's rows wrong (see above). Returns
    the tables whose last batch ran other logic than today's profile gives, each with that
    logic's hash (gold/tables.logic_hash), after warning about them."""
    from gold.tables import logic_hash

    check_not_switching(cfg, "gold")
    checkpoint = cfg.checkpoint(query)
    mine = checkpoint_id(checkpoint)          # None: no query has started on it yet
    state = refresh_state(cfg, query)
    if state and state.get("phase") == "switching":
        # Some tables may hold the refresh's rows already, and the others would go on without it.
        raise JobError(f"a refresh of {query} was stopped while switching the tables to its rebuild "
                       f"({refresh_folder(cfg, query)}): `lakehouse refresh gold` (make refresh "
                       f"TABLE=gold) finishes it, then run gold again")
    rebuild = ("Rebuild gold from silver while the pipeline runs: `lakehouse refresh gold` "
               "(make refresh TABLE=gold) builds it beside the live tables and switches them "
               "in one commit each.")
    folded = last_logged_batch(checkpoint) if mine is not None else -1
    today, other = logic_hash(cfg), {}
    for spec in tables:
        path = cfg.table_path("gold", spec.table)
        if not is_delta_table(path):
            if folded >= 0:
                raise JobError(
                    f"gold.{spec.table} is new (profile {cfg.profile.name}), but {query} has already "
                    f"folded silver into the other gold tables up to batch {folded} ({checkpoint}): "
                    f"joining the stream now, gold.{spec.table} would start at silver's current "
                    f"position and miss every earlier event. Build every table of the selection "
                    f"from the start of silver: {rebuild}")
            continue
        writer, outside = last_lineage(spark, path)
        if writer is not None and writer.get("query_id") != mine:
            raise JobError(
                f"gold.{spec.table} was written by query {writer.get('query')} (checkpoint id "
                f"{writer.get('query_id')}), not by {query} ({checkpoint}"
                f"{', which does not exist yet' if mine is None else ''}): its rows are the sum "
                f"of the batches that query folded in, and another one would count silver's "
                f"events again. Run the selection that wrote it (`--only`), or: {rebuild}")
        if writer is not None and outside:
            version, operation = outside[-1]
            raise JobError(
                f"gold.{spec.table} was changed outside the pipeline ({operation} at version "
                f"{version}) after the last batch of {query}: its rows no longer hold what the "
                f"query folded in, and the next batches would build on them. {rebuild}")
        made_with = ((writer or {}).get("logic") or {}).get("hash")
        if made_with not in (None, today):
            other[spec.table] = made_with
    if other:
        logging.getLogger(__name__).warning(
            f"{', '.join(f'gold.{t}' for t in other)}: last written with other logic than profile "
            f"{cfg.profile.name} gives today (hash {', '.join(sorted(set(other.values())))}, today "
            f"{today}): the rows this run changes follow today's, the others keep the old logic's. "
            f"{rebuild}")
    return other
