"""Hand-over: a refresh switches a layer's tables while the process running that layer (run-all,
run-silver, run-gold) runs on.

The switch needs the layer's live checkpoint to itself: the tables are overwritten and the
checkpoint swapped between two of the live query's batches. A refresh that finds the
checkpoint held leaves a request beside it (`<query>.handover`: its pid and refresh id). The
runner's flow of that query sees it between batches, stops the query after its batch, lends its
checkpoint lock, and waits; the refresh takes the lock, switches, gives it back and withdraws the
request; the flow takes the lock again and starts its query on the swapped checkpoint. A gold
refresh holds gold only; a silver refresh holds gold, then silver (gold is rebuilt from the new
silver before it goes on). Bronze never stops, and each held query pauses for its switch only.

The refreshed tables follow the refresh's logic (its profile, its code), which the process may
not run: a refresh usually follows a profile change. The request names both. Same logic: the
flow starts again as it was. Another profile: the flow reloads the configuration the way the
process loaded it at its start (conf, profile, environment, its flags) and, if that gives the
refresh's logic, runs the layer by it from then on. Anything else (other code, a profile on disk
that differs again): the layer stays stopped in this process, saying why, so no version mixes two
logics; the layers before it go on, and a restart runs it on the refreshed checkpoint.

A refresh killed meanwhile leaves its request behind: the flow sees that its pid is gone, removes
it and goes on, on whichever checkpoint is in place (the next `lakehouse refresh` finishes a
switch it interrupted). Local checkpoints only, as the refresh itself.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".handover"
REPO = Path(__file__).resolve().parent.parent


def code_version() -> str:
    """The commit the code runs from (`+dirty` with uncommitted changes), or `unknown`."""
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10)  # noqa: E731
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def request_path(cfg, query: str) -> Path:
    return Path(cfg.checkpoint(query)).with_name(f"{query}{SUFFIX}")


def ask(cfg, query: str, refresh_id: str, logic: str, code: str, only=None) -> Path:
    """Leave the request: the refresh's pid and id, and the logic its tables follow (the hash
    of gold/tables.logic_hash, the code version, the --only selection of the query)."""
    path = request_path(cfg, query)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "refresh": refresh_id, "logic": logic, "code": code,
                               "only": sorted(only) if only is not None else None,
                               "asked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    tmp.replace(path)
    return path


def withdraw(cfg, query: str) -> None:
    request_path(cfg, query).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pending(path: Path) -> dict | None:
    """The request at `path`, or None: none there, or its refresh is gone (then removed)."""
    try:
        asked = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:              # being written: the next poll reads it whole
        return {}
    if not _alive(int(asked.get("pid", 0))):
        log.warning(f"{path}: the refresh that asked for the hand-over (pid {asked.get('pid')}) is gone; "
                    "going on")
        path.unlink(missing_ok=True)
        return None
    return asked


class HandOver:
    """The runner's side: which flows may be asked, the lending of their locks, and the flow
    each goes on with."""

    def __init__(self, cfg, locks, queries, reload=None, poll_s: float = 0.5):
        self.cfg, self.locks, self.reload, self.poll_s = cfg, locks, reload, poll_s
        self.paths = {q: request_path(cfg, q) for q in queries}
        self.logic = {layer: logic(layer, cfg) for layer in ("silver", "gold")}   # what this process runs
        self.code = code_version()

    def asked(self, query: str) -> bool:
        path = self.paths.get(query)
        return path is not None and path.exists() and pending(path) is not None

    def lend(self, run):
        """Stop `run`'s query between batches, lend its lock until the refresh is done, take it
        back; returns the flow to start on the swapped checkpoint, or None: the run is told to
        stop meanwhile, or gold cannot follow the refresh's logic here (said in the log)."""
        from common.checkpoint_lock import CheckpointBusy
        from common.streaming import stop_between_batches

        name, path = run.flow.name, self.paths[run.flow.name]
        asked = pending(path) or {}
        log.info(f"{name}: handing the checkpoint over to refresh {asked.get('refresh', '?')} "
                 "after this batch")
        stop_between_batches(run.query)
        run.query.awaitTermination()          # raises if the batch failed
        self.locks.lend(name)
        while pending(path) is not None:
            if run._stopping():
                return None
            time.sleep(self.poll_s)
        while True:
            try:
                self.locks.take_back(name)
                break
            except CheckpointBusy:        # the refresh is letting go of it
                if run._stopping():
                    return None
                time.sleep(self.poll_s)
        return self.follow(run, asked)

    def follow(self, run, asked: dict):
        """The flow that runs the refreshed tables' logic, or None (logged)."""
        name, refresh, layer = run.flow.name, asked.get("refresh", "?"), run.flow.layer
        stay = (f"{name}: stays stopped in this process, so that no {layer} version mixes two logics "
                "(the other layers go on); restart the process to run it on the refreshed checkpoint")
        if asked.get("code") not in (None, self.code):
            log.error(f"refresh {refresh} rebuilt {layer} with code {asked['code']}; this process runs "
                      f"{self.code}. {stay}")
            return None
        if asked.get("logic") in (None, self.logic[layer]):
            log.info(f"{name}: checkpoint back from refresh {refresh}; going on")
            return run.flow
        fresh = self.reload() if self.reload is not None else None
        if fresh is None or logic(layer, fresh) != asked["logic"]:
            log.error(f"refresh {refresh} rebuilt {layer} with other logic than this process runs, and "
                      f"{'the configuration on disk gives yet another' if fresh else 'it cannot reload its own'}. {stay}")
            return None
        if layer == "gold":
            from gold.job import layer as gold_layer

            only = set(asked["only"]) if asked.get("only") is not None else None
            flows = gold_layer(fresh, only=only)
        else:
            from silver.job import layer as silver_layer

            flows = silver_layer(fresh)
        flows.prepare(run.spark)
        self.logic[layer] = asked["logic"]
        log.info(f"{name}: checkpoint back from refresh {refresh}; runs its logic from now on "
                 f"(profile {fresh.profile.name} reloaded)")
        return flows.flows[0]


def logic(layer: str, cfg) -> str:
    """The hash of what decides `layer`'s rows (a refresh's request names the one it built with)."""
    if layer == "gold":
        from gold.tables import logic_hash
    else:
        from silver.logic import logic_hash
    return logic_hash(cfg)
