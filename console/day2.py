"""Day two of a lakehouse, scripted: what changes while the pipeline runs.

    python -m console.day2 [-n EVENTS] [--seed N]        (make demo-day2)

On a lakehouse of its own (LAKEHOUSE_ROOT, default ./lakehouse-day2, started afresh; its profiles
are a copy of conf/profiles in ./lakehouse-day2-profiles, changed by step 5), with the pipeline
streaming (run-all, processing-time) the whole time:

  1. a feed lands and flows to gold;
  2. a camera that was offline uploads its backlog: events behind gold's watermark, kept in
     silver.late_events; `lakehouse backfill` asks the running gold query to fold them in;
  3. a camera moves: a locations file with an as-of time; its events before the move stay
     with the old zip code, those after go to the new one;
  4. the feed drifts (a new field, a type change, a removed field): rescued or quarantined by
     reason; gold's watermark moves on and the backlog is folded into gold;
  5. the new field is declared in the profile and `lakehouse refresh silver` recomputes silver
     from bronze's raw records (the new column filled for past events too), then gold from it,
     while the pipeline streams on and takes the new profile;
  6. the session gap changes: `lakehouse refresh gold` rebuilds gold beside the live tables and
     switches each in one commit (gold stops for the switch), then streams on;
  7. `make audit` proves every gold version (backfills and refresh included), and a consumer
     of gold's change feed rebuilds each table exactly.

Each step prints what it did and what the tables say. Exit code 0 when every check holds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from common.errors import JobError, command

REPO = Path(__file__).resolve().parent.parent
BACKLOG = "cam-day2-offline"       # the camera that was offline (unknown to the locations file
MOVER = "cam-day2-mover"           # at first) and the one that moves


def say(step: str, text: str = "") -> None:
    print(f"\n== {step}" + (f"\n{text}" if text else ""), flush=True)


class Lake:
    """The scenario's lakehouse: its environment, SQL without a JVM, the running pipeline."""

    def __init__(self, root: Path):
        from common.config import load_config

        self.root = root
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "TRIGGER") and not k.startswith("LAKEHOUSE__")}
        self.profiles = root.parent / f"{root.name}-profiles"
        shutil.rmtree(self.profiles, ignore_errors=True)
        shutil.copytree(REPO / "conf" / "profiles", self.profiles)
        self.env.update(LAKEHOUSE_ROOT=str(root), PYTHONPATH=str(REPO), PROFILES_DIR=str(self.profiles))
        self.cfg = load_config(env=self.env)
        self.pipeline: subprocess.Popen | None = None

    def sql(self, query: str) -> list[tuple]:
        from tools.embedded_sql import EmbeddedEngine

        return EmbeddedEngine(self.cfg).query(query, 10_000)[1]

    def one(self, query: str):
        rows = self.sql(query)
        return rows[0][0] if rows else None

    def run(self, *args: str, env: dict | None = None) -> str:
        proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env={**self.env, **(env or {})},
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise JobError(f"`python -m {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        return proc.stdout

    def start(self) -> None:
        log = open(self.root.parent / f"{self.root.name}-pipeline.log", "w")
        self.pipeline = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "--trigger", "processing-time", "--interval", "2 seconds"],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        if self.pipeline is None:
            return 0
        self.pipeline.send_signal(signal.SIGTERM)
        code = self.pipeline.wait(timeout=300)
        self.pipeline = None
        return code

    def wait(self, what: str, done, timeout: float = 600) -> None:
        """Poll `done()` (tables not there yet count as not done) until true."""
        from tools.embedded_sql import QueryError

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pipeline is not None and self.pipeline.poll() is not None:
                raise JobError(f"the pipeline stopped (exit {self.pipeline.returncode}) while waiting for {what}; "
                               f"see {self.root.parent / (self.root.name + '-pipeline.log')}")
            try:
                if done():
                    return
            except (QueryError, OSError, ValueError):
                pass
            time.sleep(2)
        raise JobError(f"timed out after {timeout:.0f} s waiting for {what}")

    def land(self, name: str, lines: list[str]) -> None:
        landing = Path(self.cfg.landing)
        landing.mkdir(parents=True, exist_ok=True)
        tmp = landing / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(landing / f"{name}.json")


def record(device: str, at: datetime, person: bool = True) -> str:
    stamp = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    camera = {"device_id": device, "name": device, "is_online": True,
              "last_event": {"has_sound": False, "has_motion": True, "has_person": person,
                             "start_time": stamp, "end_time": stamp}}
    return json.dumps({"devices": {"cameras": {device: camera}}})


def declare_battery(profiles: Path) -> None:
    """The nest profile in `profiles`, declaring the drifted feed's new key (tools/generator):
    read as text in the raw schema, typed double."""
    path = profiles / "nest.yaml"
    text = path.read_text()
    text = text.replace("is_online: STRING,", "is_online: STRING, battery_level: STRING,", 1)
    text = text.replace("    - {name: is_online, type: boolean}\n",
                        "    - {name: is_online, type: boolean}\n    - {name: battery_level, type: double}\n", 1)
    if "battery_level: STRING" not in text or "name: battery_level" not in text:
        raise JobError(f"{path}: could not declare battery_level (the profile's is_online field moved?)")
    path.write_text(text)


def frontier(lake: Lake) -> datetime:
    t = lake.one("SELECT max(event_time) FROM silver.camera_events")
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def mirror(lake: Lake) -> int:
    from audit.changes import mirror_differences
    from common.spark import session

    # From version 0 into an empty folder: a mirror (and its checkpoints) left by an earlier
    # demo follows the tables that demo made, and its stream refuses the new ones.
    workdir = lake.root.parent / f"{lake.root.name}-mirror"
    shutil.rmtree(workdir, ignore_errors=True)
    with session(lake.cfg, "day2-mirror") as spark:
        differ = mirror_differences(spark, lake.cfg, str(workdir))
    print(json.dumps(differ))
    return 0


@command
def main(argv=None, prog: str = "console.day2") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--events", type=int, default=3000, help="events of the first feed (default 3000)")
    parser.add_argument("--seed", type=int, default=7, help="the generator's seed (default 7)")
    parser.add_argument("--mirror", action="store_true", help=argparse.SUPPRESS)   # step 4's consumer, in a JVM of its own
    args = parser.parse_args(argv)
    root = Path(os.environ.get("LAKEHOUSE_ROOT") or REPO / "lakehouse-day2").resolve()
    if args.mirror:
        return mirror(Lake(root))
    shutil.rmtree(root, ignore_errors=True)
    lake = Lake(root)
    checks: list[tuple[str, bool]] = []
    try:
        say("1. a feed lands; the pipeline streams it to gold", f"lakehouse: {root}")
        lake.run("tools.generator", "-n", str(args.events), "--seed", str(args.seed))
        lake.start()
        lake.wait("gold's first sessions", lambda: (lake.one("SELECT count(*) FROM gold.device_sessions") or 0) > 0)
        lake.wait("gold to take in the feed", lambda: lake.one(
            "SELECT sum(rows_in) FROM ops.batch_accounting WHERE layer = 'gold'") == lake.one(
            "SELECT count(*) FROM silver.camera_events"))
        edge = frontier(lake)
        print(f"silver: {lake.one('SELECT count(*) FROM silver.camera_events')} events up to {edge:%Y-%m-%d %H:%M}; "
              f"gold: {lake.one('SELECT count(*) FROM gold.device_sessions')} sessions")

        say("2. a camera that was offline uploads its backlog: late for gold, kept, backfill asked")
        backlog = [edge - timedelta(minutes=m) for m in (100, 95, 90, 85)]   # behind gold's 1-hour watermark
        lake.land("backlog", [record(BACKLOG, t) for t in backlog])
        lake.wait("the backlog in silver.late_events", lambda: lake.one(
            f"SELECT count(*) FROM silver.late_events WHERE device_id = '{BACKLOG}'") == len(backlog))
        print(lake.run("tools.sql", f"SELECT device_id, event_time, found_watermark, backfilled_by FROM silver.late_events "
                                    f"WHERE device_id = '{BACKLOG}' ORDER BY event_time"))
        before = lake.one(f"SELECT coalesce(sum(events), 0) FROM gold.device_sessions WHERE device_id = '{BACKLOG}'")
        # Its session is still open for gold (last event + gap is past the watermark): the
        # running query folds the backlog in once its watermark has passed that.
        print(lake.run("gold.backfill").strip())

        say("3. a camera moves: its events after the move count for the new zip code")
        move_at = edge + timedelta(minutes=30)
        reference = Path(lake.cfg.locations_csv)
        first = reference.parent / "mover.csv"
        first.write_text("device_id,zip_code,city,state,as_of\n"
                         f"{MOVER},02108,Boston,MA,{(edge - timedelta(days=30)):%Y-%m-%dT%H:%M:%SZ}\n")
        lake.run("silver.locations", "load", str(first))
        moved = reference.parent / "moved.csv"
        moved.write_text("device_id,zip_code,city,state,as_of\n"
                         f"{MOVER},94105,San Francisco,CA,{move_at:%Y-%m-%dT%H:%M:%SZ}\n")
        lake.run("silver.locations", "load", str(moved))
        lake.land("mover", [record(MOVER, edge + timedelta(minutes=m)) for m in (5, 10, 40, 45, 50)])
        lake.wait("the mover's events in silver", lambda: lake.one(
            f"SELECT count(*) FROM silver.camera_events WHERE device_id = '{MOVER}'") == 5)
        by_zip = dict(lake.sql(f"SELECT zip_code, count(*) FROM silver.camera_events WHERE device_id = '{MOVER}' GROUP BY zip_code"))
        print(f"{MOVER}'s events by zip code: {by_zip} (moved at {move_at:%H:%M})")
        checks.append(("events before the move stay with the old zip", by_zip == {"02108": 2, "94105": 3}))

        say("4. the feed changes shape: a new field, a type change, a removed field")
        drift_env = {"LAKEHOUSE__GENERATOR__START": f"{edge + timedelta(hours=2):%Y-%m-%dT%H:%M:%SZ}",
                     "LAKEHOUSE__GENERATOR__SPAN": "2 hours"}
        lake.run("tools.generator", "-n", "300", "--seed", str(args.seed + 1), "--drift", "0.4", env=drift_env)
        lake.wait("the drifted feed in silver and quarantine", lambda: (lake.one(
            "SELECT count(*) FROM silver.camera_events WHERE _rescued_data IS NOT NULL") or 0) > 0 and (lake.one(
            "SELECT count(*) FROM silver.quarantine WHERE array_contains(reasons, 'missing_field:has_sound')") or 0) > 0)
        print(lake.run("tools.sql", "SELECT _rescued_data, count(*) AS events FROM silver.camera_events "
                                    "WHERE _rescued_data IS NOT NULL GROUP BY 1 ORDER BY 2 DESC LIMIT 3"))
        print(lake.run("tools.sql", "SELECT reason, count(*) AS rows FROM (SELECT explode(reasons) AS reason "
                                    "FROM silver.quarantine) GROUP BY 1 ORDER BY 2 DESC"))
        checks.append(("drifted events rescued or quarantined by reason", True))

        # The drifted feed moved gold's watermark past the backlog's session: folded in.
        # (the events are marked first, then each table written: wait for the sessions table)
        lake.wait("the running gold query to backfill the backlog", lambda: lake.one(
            f"SELECT sum(events) FROM gold.device_sessions WHERE device_id = '{BACKLOG}'") == len(backlog))
        after = lake.one(f"SELECT sum(events) FROM gold.device_sessions WHERE device_id = '{BACKLOG}'")
        print(f"backfilled: gold.device_sessions events of {BACKLOG}: {before} before, {after} after")
        checks.append(("the backlog reached gold's sessions", before == 0 and after == len(backlog)))

        say("5. the new field is declared in the profile; silver is refreshed from bronze's raw records",
            "(the running pipeline hands silver and gold over between two batches and parses by the new "
            "profile from then on; gold is rebuilt from the refreshed silver)")
        carried = "_rescued_data LIKE '%battery_level%'"
        rescued = lake.one(f"SELECT count(*) FROM silver.camera_events WHERE {carried}")
        declare_battery(lake.profiles)
        print(lake.run("pipeline.refresh", "silver", "--wait", "300").strip())
        print(lake.run("gold.backfill").strip())      # the late events gold's rebuild kept again
        filled = lake.one("SELECT count(*) FROM silver.camera_events WHERE battery_level IS NOT NULL")
        left = lake.one(f"SELECT count(*) FROM silver.camera_events WHERE {carried}")
        print(f"silver.camera_events: {rescued} events held battery_level in _rescued_data; now {filled} "
              f"have it as a column, {left} in _rescued_data")
        # The rebuild may take in as on time an event the stream had found late: more, never fewer.
        checks.append(("a declared field filled for past events by a silver refresh", filled >= rescued > 0 == left))

        say("6. a logic change: the session gap goes from 30 to 20 minutes; gold is refreshed",
            "(the gap is set in the environment, which a running process does not read again: the "
            "pipeline stops, gold is rebuilt beside its tables and switched in one commit per table, "
            "and the pipeline starts again on the new logic; step 5 refreshed while it ran)")
        sessions_before = lake.one("SELECT count(*) FROM gold.device_sessions")
        checks.append(("the pipeline stopped cleanly for the new setting", lake.stop() == 0))
        lake.env["LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP"] = "20 minutes"
        print(lake.run("pipeline.refresh", "gold").strip())
        print(lake.run("gold.backfill").strip())      # the late events the rebuild kept again
        lake.start()
        lake.land("after-refresh", [record(MOVER, edge + timedelta(hours=5, minutes=m)) for m in (0, 10)])
        lake.wait("the live gold query on the refreshed tables", lambda: lake.one(
            f"SELECT count(*) FROM gold.device_sessions WHERE device_id = '{MOVER}' "
            f"AND session_start >= TIMESTAMP '{edge + timedelta(hours=5):%Y-%m-%d %H:%M:%S}'") == 1)
        print(f"gold.device_sessions: {sessions_before} sessions with a 30-minute gap, "
              f"{lake.one('SELECT count(*) FROM gold.device_sessions')} with a 20-minute one")

        say("7. the pipeline stops; the audit proves every gold version")
        checks.append(("the pipeline stopped cleanly at the end", lake.stop() == 0))
        report = json.loads(lake.run("audit", "--json"))
        failures = report.get("failures") or []
        print("audit: " + ("PASS" if report.get("ok") else "FAIL\n  " + "\n  ".join(failures)))
        made = [c.get("made_by") or "" for t in report["tables"] for c in t.get("prefix", [])]
        print(f"  gold versions made by backfills: {sum(m.startswith('backfill') for m in made)}")
        checks.append(("audit PASS, backfills and the refresh included", bool(report.get("ok"))))
        differ = json.loads(lake.run("console.day2", "--mirror"))
        print("change-feed consumer (docs/change-feed.md) from version 0, rows differing per gold table: "
              + ", ".join(f"{t} {n}" for t, n in differ.items()))
        checks.append(("a change-feed consumer rebuilds each gold table", not any(differ.values())))
    finally:
        lake.stop()
    say("day two", "\n".join(f"  [{'x' if ok else ' '}] {name}" for name, ok in checks))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
