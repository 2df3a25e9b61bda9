"""Which profile a lakehouse root belongs to.

A root holds one feed's tables: bronze.events is every record its landing or topic gave, and
the checkpoints are its queries'. `make run-bronze PROFILE=events` on the root `make demo`
filled (LAKEHOUSE_ROOT defaults to ./lakehouse for every profile) would append the events
feed to Nest's bronze, and the next silver batches would quarantine it all. The first run
writes the profile's name beside the tables; a run of another profile there is refused before
anything starts, naming both. A root from before the marker is claimed only on evidence (it
holds the profile's silver table)."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from common.storage import location, write_atomic

MARKER = "_lakehouse.json"


def marker(cfg):
    return location(str(cfg.root)) / MARKER


def owner(cfg) -> str | None:
    """The profile whose lakehouse the root is (None: no run has claimed it yet)."""
    path = marker(cfg)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text()).get("profile")
    except (ValueError, AttributeError):      # not ours, or cut short: say so, never guess
        return f"<unreadable {MARKER}>"


def problem(cfg) -> str | None:
    """Why a run of cfg's profile may not write to the root, or None."""
    found, mine = owner(cfg), cfg.profile.name
    if found in (None, mine):
        return None
    return (f"the lakehouse at {cfg.root} belongs to profile {found} ({marker(cfg)}), not to "
            f"{mine}: its bronze holds {found}'s feed and its checkpoints are {found}'s queries. "
            f"Give profile {mine} a lakehouse of its own (LAKEHOUSE_ROOT=<another folder>), or run "
            f"PROFILE={found}; a renamed profile: write its new name in {MARKER}")


def claim(cfg) -> None:
    """Mark the root as cfg's profile's, once (problem() said it may): a fresh root, or one from
    before the marker that holds the silver table cfg's profile writes. Another root from
    before it (bronze alone, or another profile's silver) stays unmarked: its owner cannot be
    told from the files, and a wrong guess would refuse its own runs."""
    from common.storage import is_delta_table

    path = marker(cfg)
    if path.exists() or getattr(cfg, "shadow", False):
        return
    if (is_delta_table(cfg.table_path("bronze", "events"))
            and not is_delta_table(cfg.table_path("silver", cfg.silver_table))):
        return
    write_atomic(path, (json.dumps({"profile": cfg.profile.name, "claimed": datetime.now(
        timezone.utc).isoformat(timespec="seconds")}) + "\n").encode())
