"""Where a refresh (pipeline/refresh.py, pipeline/refresh_silver.py) keeps a query's shadow
checkpoint and its state, read by the layers too: a silver or gold run refuses to start on a
lakehouse a killed refresh left half switched."""
from __future__ import annotations

import json
from pathlib import Path

from common.errors import JobError

REFRESH = "_refresh"
SILVER = "silver"          # the silver query, whose refresh rebuilds gold after it


def refresh_folder(cfg, query: str) -> Path:
    return Path(str(cfg.checkpoint_root)) / REFRESH / query


def refresh_state(cfg, query: str) -> dict | None:
    """The state of a refresh of `query` that has not finished (None: none)."""
    path = refresh_folder(cfg, query) / "refresh.json"
    return json.loads(path.read_text()) if path.is_file() else None


def check_not_switching(cfg, layer: str) -> None:
    """Refuse to run `layer` on a lakehouse a killed silver refresh left half switched: silver
    runs again once its tables are switched, gold once the refresh has rebuilt it too. The
    refresh's own build (a shadow configuration) is let through."""
    state = refresh_state(cfg, SILVER)
    stopped = ("switching",) if layer == "silver" else ("switching", "gold")
    if getattr(cfg, "shadow", False) or not state or state.get("phase") not in stopped:
        return
    where = "silver's tables" if state["phase"] == "switching" else "gold, after silver's switch"
    raise JobError(f"a refresh of silver ({state.get('id')}) was stopped while switching {where} "
                   f"({refresh_folder(cfg, SILVER)}): `lakehouse refresh silver` (make refresh "
                   f"TABLE=silver) finishes it, then run {layer} again")
