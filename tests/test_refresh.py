"""lakehouse refresh: gold rebuilt from silver with a changed profile while silver keeps
ingesting, switched in one commit per table; readers never see an empty, partial or mixed table,
the live stream goes on from the refresh's checkpoint, and the audit proves every version.

The lakehouse is built by the real jobs (bronze file source, silver, gold) with the default
30-minute session gap; the refresh runs with a 10-minute gap, which splits sessions (so a
reader's row count only grows) and changes which rows a version holds (so each version follows
one logic or the other, provably)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from common.config import load_config
from common.errors import JobError
from common.internals import checkpoint_id
from gold.owner import check_owner
from gold.tables import for_config, logic_hash
from pipeline.refresh import refresh
from tests.test_audit import LOCATIONS, REPO, forget_names, record

NEW_GAP = {"LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP": "10 minutes"}

ROUNDS = [
    # cam-0001 every 20 minutes: one session under a 30-minute gap, three under a 10-minute one
    [record(("cam-0001", "10:00"), ("cam-0002", "10:00")), record(("cam-0001", "10:20")),
     record(("cam-0001", "10:40"), ("cam-0002", "10:05")), record(("cam-0003", "10:30"))],
    [record(("cam-0001", "12:00"), ("cam-0002", "12:20")), record(("cam-0002", "12:35")),
     record(("cam-0003", "12:50"), ("cam-0001", "13:05")),
     record(("cam-0003", "09:30"))],                  # late for gold: kept, backfilled after the refresh
    # lands while the refresh runs
    [record(("cam-0001", "14:00"), ("cam-0003", "14:15")), record(("cam-0001", "14:20")),
     record(("cam-0002", "14:45"))],
    # lands after it, on the refreshed checkpoint
    [record(("cam-0002", "16:00"), ("cam-0003", "16:25")), record(("cam-0002", "16:20"))],
]


def config(root: Path, **extra: str):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")
           and not k.startswith("LAKEHOUSE__")}
    return load_config(env={**env, "LAKEHOUSE_ROOT": str(root / "lakehouse"), "TRIGGER": "available-now", **extra})


def land(cfg, n: int, rounds=ROUNDS) -> None:
    landing = Path(cfg.landing)
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".round-{n}.tmp"
    tmp.write_text("\n".join(rounds[n]) + "\n")
    tmp.rename(landing / f"round-{n}.json")


def run(spark, cfg, *layers: str) -> None:
    from pipeline.runner import start

    options = {"bronze": {"source": "files"}, "silver": {}, "gold": {"suites": {}}}
    for name in layers:
        for query in start(spark, cfg, name, **options[name]):
            query.awaitTermination()


def version(spark, path: str) -> int:
    return DeltaTable.forPath(spark, path).history(1).first().version


class Reader(threading.Thread):
    """Reads the table's latest version over and over, as a dashboard would: (version, rows)."""

    def __init__(self, spark, path: str):
        super().__init__(daemon=True)
        self.spark, self.path = spark, path
        self.stop, self.seen, self.error = threading.Event(), [], None

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                v = version(self.spark, self.path)
                n = self.spark.read.format("delta").option("versionAsOf", v).load(self.path).count()
                self.seen.append((v, n))
        except BaseException as e:   # noqa: BLE001 - the test raises it
            self.error = e

    def read_through(self, version: int, seconds: float = 120) -> None:
        """Stop once it has read `version` (the switched one) or later; raise what it met."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.error is None and not any(v >= version for v, _ in self.seen):
            time.sleep(0.2)
        self.stop.set()
        self.join()
        assert self.error is None, self.error


def switch_version(spark, path: str) -> tuple[int, dict]:
    from common.lineage import parse

    rows = DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect()
    found = [(r.version, parse(r.userMetadata)) for r in rows if (parse(r.userMetadata) or {}).get("refresh")]
    assert len(found) == 1, found
    return found[0]


def prefix(report: dict, table: str) -> list[dict]:
    return next(t["prefix"] for t in report["tables"] if t["table"] == table)


@pytest.fixture(scope="module")
def refreshed(spark, tmp_path_factory):
    """Gold built with a 30-minute gap, refreshed with a 10-minute one while bronze and silver
    ingest a round, then the live gold run and one more round on the refreshed checkpoint."""
    root = tmp_path_factory.mktemp("refresh")
    old, new = config(root), config(root, **NEW_GAP)
    old.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    old.locations_csv.write_text(LOCATIONS)
    land(old, 0)
    run(spark, old, "bronze", "silver", "gold")
    land(old, 1)
    run(spark, old, "bronze", "silver", "gold")
    sessions = old.table_path("gold", "device_sessions")
    before = {t: version(spark, old.table_path("gold", t)) for t in old.tables["gold"]}
    old_rows = spark.read.format("delta").load(sessions).count()
    replaced = checkpoint_id(old.checkpoint("gold"))
    stale = check_owner(spark, new, "gold", for_config(new))    # what gold's next start warns of

    reader = Reader(spark, sessions)
    reader.start()
    fed = threading.Event()

    def feed():
        land(new, 2)
        run(spark, new, "bronze", "silver")
        fed.set()
    feeder = threading.Thread(target=feed, daemon=True)
    started = time.monotonic()
    feeder.start()
    done = refresh(spark, new, "gold", wait_s=5)
    took = time.monotonic() - started
    feeder.join()
    switched = dict(done["tables"])["device_sessions"]
    reader.read_through(switched)
    assert fed.is_set()
    land(new, 3)
    # The live stream, on the refresh's checkpoint: what silver gained after the switch's last
    # round (if any of round 2) and round 3.
    run(spark, new, "bronze", "silver", "gold")
    from audit.__main__ import run_audit

    yield dict(old=old, new=new, done=done, reader=reader.seen, before=before, old_rows=old_rows,
               replaced=replaced, took=took, sessions=sessions, stale=stale,
               stale_after=check_owner(spark, new, "gold", for_config(new)),
               audit_new=run_audit(spark, new), audit_old=run_audit(spark, old, "gold.device_sessions"))
    forget_names(spark)


def test_each_gold_table_switches_in_one_commit_whose_lineage_names_the_refresh(spark, refreshed):
    new, done = refreshed["new"], refreshed["done"]
    live_id = checkpoint_id(new.checkpoint("gold"))
    assert live_id == done["query_id"] != refreshed["replaced"]
    for table in new.tables["gold"]:
        at, lineage = switch_version(spark, new.table_path("gold", table))
        assert at > refreshed["before"][table], table
        r = lineage["refresh"]
        assert r["made_by"] == "lakehouse refresh" and r["id"] == done["id"] and r["code"]
        assert r["profile"] == "nest" and r["logic"] == logic_hash(new) != logic_hash(refreshed["old"])
        assert r["replaced_query_id"] == refreshed["replaced"]
        assert lineage["query_id"] == live_id and lineage["logic"]["hash"] == logic_hash(new)
        assert lineage["upstream"]["version"] == r["silver_version"] or lineage["upstream"]["version"] <= r["silver_version"]
    # Nothing of the refresh is left beside the live tables.
    assert not (Path(str(new.root)) / "gold" / "_refresh").exists()
    assert not (Path(str(new.checkpoint_root)) / "_refresh" / "gold").exists()


def test_gold_started_on_a_changed_profile_names_the_tables_of_the_old_logic_until_the_refresh(refreshed):
    """Before the refresh, gold's start would go on with the 10-minute gap over tables whose last
    batch ran the 30-minute one: it names every table and the old logic; after it, none."""
    old, new = refreshed["old"], refreshed["new"]
    assert refreshed["stale"] == {t: logic_hash(old) for t in new.tables["gold"]}
    assert refreshed["stale_after"] == {}


def test_readers_never_see_a_smaller_or_empty_table_and_the_old_one_stays_readable(spark, refreshed):
    seen, sessions = refreshed["reader"], refreshed["sessions"]
    at, _ = switch_version(spark, sessions)
    assert seen and min(v for v, _ in seen) < at <= max(v for v, _ in seen), \
        f"the reader saw no version on one side of the switch (version {at}): {seen}"
    counts = [n for _, n in seen]
    assert all(b >= a for a, b in zip(counts, counts[1:])), seen
    assert min(counts) >= refreshed["old_rows"] > 0
    # More sessions with the shorter gap: the switched version is not the old logic's.
    before_switch = spark.read.format("delta").option("versionAsOf", at - 1).load(sessions).count()
    assert before_switch == refreshed["old_rows"]
    assert spark.read.format("delta").option("versionAsOf", at).load(sessions).count() > before_switch


def test_every_version_read_follows_one_logic_wholly_and_the_audit_proves_it(spark, refreshed):
    """Each version is the batch recompute of its silver prefix with the old gap (before the
    switch) or the new one (from it on): none is a mix of both."""
    at, _ = switch_version(spark, refreshed["sessions"])
    new, old = prefix(refreshed["audit_new"], "gold.device_sessions"), prefix(refreshed["audit_old"], "gold.device_sessions")
    assert refreshed["audit_new"]["ok"], refreshed["audit_new"]["failures"]
    assert refreshed["audit_old"]["ok"], refreshed["audit_old"]["failures"]
    made = {c["version"] for c in new if c["operation"] != "CREATE TABLE"}
    for c in new:
        if c["version"] >= at:
            assert c["status"] == "PASS", c
        elif c["version"] in made:
            assert c["status"] == "SKIP" and "other logic" in c["note"], c
    for c in old:
        if c["version"] < at:
            assert c["status"] == "PASS", c
        else:
            assert c["status"] == "SKIP", c
    read = {v for v, _ in refreshed["reader"]}
    proven = {c["version"] for c in new if c["status"] == "PASS"} | {c["version"] for c in old if c["status"] == "PASS"}
    assert read <= proven, sorted(read - proven)
    # Every gold table, every version of it since the switch, and the accounting books.
    for table in refreshed["new"].tables["gold"]:
        at_t, _ = switch_version(spark, refreshed["new"].table_path("gold", table))
        checks = [c for c in prefix(refreshed["audit_new"], f"gold.{table}") if c["version"] >= at_t]
        assert checks and all(c["status"] == "PASS" for c in checks), (table, checks)
    books = {b["name"]: b for b in refreshed["audit_new"]["accounting"]}
    assert all(b["status"] == "PASS" for b in books.values()), books


def test_the_live_stream_goes_on_from_the_refresh_and_lands_later_rows_once(spark, refreshed):
    new = refreshed["new"]
    sessions = refreshed["sessions"]
    at, switched = switch_version(spark, sessions)
    after = [r for r in DeltaTable.forPath(spark, sessions).history().where(f"version > {at}").collect()
             if r.userMetadata]
    from common.lineage import parse

    ids = {parse(r.userMetadata)["query_id"] for r in after if parse(r.userMetadata)}
    assert ids == {switched["query_id"]}, ids
    batches = sorted(parse(r.userMetadata)["batch_id"] for r in after if parse(r.userMetadata))
    assert batches and batches[0] > switched["batch_id"]
    # Every silver event is in gold once: the hourly sightings count each on-time event once,
    # the last round's included (its 16:00 hour).
    hourly = spark.read.format("delta").load(new.table_path("gold", "zip_hourly_sightings"))
    assert hourly.where("window_start >= '2026-11-01 16:00:00'").count() > 0
    last = [c for c in prefix(refreshed["audit_new"], "gold.zip_hourly_sightings")][-1]
    assert last["status"] == "PASS" and last["upstream"] == version(spark, new.table_path("silver", "camera_events"))


def test_the_change_feed_rebuilds_gold_through_the_refresh_and_a_backfill_after_it(spark, refreshed, tmp_path):
    """A consumer of gold's change feed (docs/change-feed.md, as written) from version 0, through
    the batches before the refresh, its switch (an overwrite), the batches after it and a
    backfill of the late events the build kept again, ends equal to every table (on a copy)."""
    import shutil

    from audit.__main__ import run_audit
    from audit.changes import mirror_differences
    from gold.backfill import Backfill

    shutil.copytree(Path(str(refreshed["new"].root)), tmp_path / "lakehouse")
    forget_names(spark)
    copy = config(tmp_path, **NEW_GAP)
    outcome = Backfill(spark, copy).run()
    assert outcome.events > 0, outcome             # the build found late events again
    assert mirror_differences(spark, copy, str(tmp_path / "mirror")) == {t: 0 for t in copy.tables["gold"]}
    report = run_audit(spark, copy)
    checks = [c for t in report["tables"] if t["table"].startswith("gold.") for c in t.get("prefix", [])]
    assert any(c["made_by"] == f"backfill {outcome.id}" and c["status"] == "PASS" for c in checks), checks
    forget_names(spark)


def test_bad_input_gets_a_clear_error_and_changes_nothing(spark, cfg, tmp_path):
    root = Path(str(cfg.root))
    with pytest.raises(JobError, match=r"gold.nope: unknown table for profile nest \(known: silver, gold, gold.zip_hourly"):
        refresh(spark, cfg, "gold.nope")
    with pytest.raises(JobError, match="silver.nope: not a table the silver query computes"):
        refresh(spark, cfg, "silver.nope")
    with pytest.raises(JobError, match="silver.device_locations is loaded from a file"):
        refresh(spark, cfg, "silver.device_locations")
    with pytest.raises(JobError, match="bronze is the raw record"):
        refresh(spark, cfg, "bronze")
    with pytest.raises(JobError, match="unknown table"):
        refresh(spark, cfg, "platinum")
    with pytest.raises(JobError, match=r"silver table .* does not exist yet"):
        refresh(spark, cfg, "gold")
    with pytest.raises(JobError, match=r"refresh silver: bronze table .* does not exist yet"):
        refresh(spark, cfg, "silver")
    assert not root.exists() or not any(root.rglob("*")), sorted(root.rglob("*"))


def kill_refresh(tmp_path, env_extra: dict, ready, what: str, table: str = "gold") -> None:
    """`lakehouse refresh <table>` in a process of its own over tmp_path's lakehouse, killed -9 as
    soon as `ready()`; fails if it ended before."""
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE__")}
    env.update(LAKEHOUSE_ROOT=str(tmp_path / "lakehouse"), TRIGGER="available-now", PYTHONPATH=str(REPO), **env_extra)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.refresh", table, "--wait", "5"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        assert proc.wait(60) == -signal.SIGKILL, f"the refresh ended before {what}"
    finally:
        if proc.poll() is None:
            proc.kill()


def switched_once(spark, cfg, refresh_id: str) -> None:
    """Every gold table has exactly one commit whose lineage names the refresh."""
    from common.lineage import parse

    for table in cfg.tables["gold"]:
        rows = DeltaTable.forPath(spark, cfg.table_path("gold", table)).history().select("userMetadata").collect()
        switches = [m for m in map(parse, (r.userMetadata for r in rows)) if m and (m.get("refresh") or {}).get("id") == refresh_id]
        assert len(switches) == 1, (table, switches)


def test_a_refresh_killed_during_its_switch_is_finished_by_running_it_again(spark, refreshed, tmp_path):
    """kill -9 of a refresh process once its switch has begun (on a copy of the refreshed
    lakehouse, with a 5-minute gap this time): every table is whole, the old or the new; gold
    refuses to start until the refresh is run again, which finishes the switch once per table."""
    import json
    import shutil

    from audit.__main__ import run_audit
    from common.delta import last_lineage
    from pipeline.runner import start

    shutil.copytree(Path(str(refreshed["new"].root)), tmp_path / "lakehouse")
    forget_names(spark)
    gap = {"LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP": "5 minutes"}
    cfg = config(tmp_path, **gap)
    before = checkpoint_id(cfg.checkpoint("gold"))
    state_file = Path(str(cfg.checkpoint_root)) / "_refresh" / "gold" / "refresh.json"
    kill_refresh(tmp_path, gap, lambda: state_file.is_file() and json.loads(state_file.read_text()).get("phase") == "switching",
                 "its switch began")
    state = json.loads(state_file.read_text())
    for table in cfg.tables["gold"]:
        writer, _ = last_lineage(spark, cfg.table_path("gold", table))
        assert writer["query_id"] in (before, state["query_id"]), table
    with pytest.raises(JobError, match="stopped while switching"):
        start(spark, cfg, "gold", suites={})
    done = refresh(spark, cfg, "gold", wait_s=5)
    assert done["id"] == state["id"] and checkpoint_id(cfg.checkpoint("gold")) == state["query_id"] != before
    assert not state_file.exists()
    switched_once(spark, cfg, state["id"])
    report = run_audit(spark, cfg, "gold.device_sessions")
    assert report["ok"], report["failures"]
    last = prefix(report, "gold.device_sessions")[-1]
    assert last["status"] == "PASS", last
    forget_names(spark)


def test_a_refresh_killed_while_it_builds_leaves_the_live_tables_alone_and_resumes(spark, refreshed, tmp_path):
    """kill -9 of a refresh process in the middle of its build (its shadow's first batch planned,
    on a copy of the refreshed lakehouse, with a 5-minute gap): no live table or checkpoint has
    changed, and the live gold run goes on by its own logic while the shadow waits. Running the
    refresh again resumes the same refresh from the shadow's checkpoint (a batch the kill cut is
    replayed once), reads what silver gained meanwhile, and switches once per table; the audit
    proves every version of every gold table."""
    import json
    import shutil

    from pyspark.sql import functions as F

    from audit.__main__ import run_audit

    shutil.copytree(Path(str(refreshed["new"].root)), tmp_path / "lakehouse")
    forget_names(spark)
    # A file source's checkpoint names its landing folder's absolute path: the copy's bronze
    # reads a landing of its own, from a checkpoint of its own.
    live = config(tmp_path, LANDING=str(tmp_path / "landing"), **NEW_GAP)
    shutil.rmtree(live.checkpoint("bronze_files"))
    gap = {"LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP": "5 minutes"}
    cfg = config(tmp_path, **gap)
    before = {t: version(spark, live.table_path("gold", t)) for t in live.tables["gold"]}
    live_id = checkpoint_id(live.checkpoint("gold"))
    shadow = Path(str(cfg.checkpoint_root)) / "_refresh" / "gold"
    kill_refresh(tmp_path, gap, (shadow / "gold" / "offsets" / "0").is_file, "its build's first batch")
    state = json.loads((shadow / "refresh.json").read_text())
    assert state["phase"] == "building"
    assert {t: version(spark, live.table_path("gold", t)) for t in live.tables["gold"]} == before
    assert checkpoint_id(live.checkpoint("gold")) == live_id

    # The live stream goes on meanwhile, by the logic it runs (a 10-minute gap).
    landing = Path(str(live.landing))
    landing.mkdir(parents=True)
    (landing / ".round-4.tmp").write_text(record(("cam-0001", "17:00")) + "\n" + record(("cam-0001", "17:08")) + "\n")
    (landing / ".round-4.tmp").rename(landing / "round-4.json")
    run(spark, live, "bronze", "silver", "gold")
    sessions = live.table_path("gold", "device_sessions")
    at_17 = lambda: (spark.read.format("delta").load(sessions)  # noqa: E731
                     .where((F.col("device_id") == "cam-0001") & (F.hour("session_start") == 17)).count())
    assert at_17() == 1
    assert checkpoint_id(live.checkpoint("gold")) == live_id

    done = refresh(spark, cfg, "gold", wait_s=5)
    assert done["id"] == state["id"], "the refresh started over instead of resuming"
    assert checkpoint_id(cfg.checkpoint("gold")) == done["query_id"] != live_id
    assert not shadow.exists()
    switched_once(spark, cfg, state["id"])
    assert at_17() == 2          # 17:00 and 17:08 by the 5-minute gap: the round reached the refreshed table
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    forget_names(spark)


def test_a_table_is_refreshed_with_the_query_that_writes_it(env):
    """One query writes a selection of gold tables from one checkpoint: gold.<table> refreshes
    that query, the whole profile's unless the table runs in an --only query. No Spark."""
    from pipeline.refresh import resolve

    cfg = load_config(env=env)
    chose = lambda name: (lambda t: (t.query, t.only, [s.table for s in t.specs]))(resolve(cfg, name))  # noqa: E731
    every = ("gold", None, list(cfg.tables["gold"]))
    assert chose("gold") == every and chose("gold.device_sessions") == every
    Path(cfg.checkpoint("gold_sightings_sessions")).mkdir(parents=True)
    assert chose("gold.device_sessions") == ("gold_sightings_sessions", {"sightings", "sessions"},
                                             ["zip_hourly_sightings", "device_sessions"])
    assert chose("gold.device_activity") == every


def start_run_all(tmp_path: Path, **env_extra: str):
    """A processing-time run-all in a process of its own on tmp_path's lakehouse: (process, log)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")
           and not k.startswith("LAKEHOUSE__")}
    env.update(LAKEHOUSE_ROOT=str(tmp_path / "lakehouse"), PYTHONPATH=str(REPO),
               LAKEHOUSE__STREAMING__BRONZE_INTERVAL="1 second", **env_extra)
    log_path = tmp_path / "run-all.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "--trigger", "processing-time"], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log_path


def stop_run_all(proc, log_path: Path) -> None:
    """SIGTERM stops every query after its batch: the process exits 0."""
    import signal

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(180) == 0, log_path.read_text()[-3000:]


def kill_run_all(proc) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def waiter(proc, log_path: Path):
    """wait_for(what, ready, seconds): until ready() is true, while the process runs."""
    def wait_for(what: str, ready, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"run-all ended (exit {proc.returncode}): {log_path.read_text()[-3000:]}"
            try:
                if ready():
                    return
            except Exception:       # noqa: BLE001 - a table not there yet
                pass
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}: {log_path.read_text()[-3000:]}")
    return wait_for


def test_a_running_pipeline_hands_gold_over_to_the_refresh_and_runs_its_logic_after(spark, tmp_path, logged):
    """run-all streams in a process of its own (processing-time) with a copy of conf/. The
    session gap is changed on disk and gold refreshed: the process hands gold's checkpoint over
    between two batches, with bronze and silver never stopped, then reloads its configuration and
    runs gold by the new gap on the refreshed checkpoint: the next round is folded in by it, and
    the audit proves every version."""
    import shutil

    from pyspark.sql import functions as F

    from audit.__main__ import run_audit
    from common.delta import last_lineage

    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    conf_file = conf / "lakehouse.yaml"
    old = config(tmp_path, LAKEHOUSE_CONF=str(conf_file))
    old.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    old.locations_csv.write_text(LOCATIONS)
    land(old, 0)
    land(old, 1)
    proc, log_path = start_run_all(tmp_path, LAKEHOUSE_CONF=str(conf_file))
    sessions = old.table_path("gold", "device_sessions")
    wait_for = waiter(proc, log_path)

    def starts(device: str, hour: int) -> int:
        return (spark.read.format("delta").load(sessions)
                .where((F.col("device_id") == device) & (F.hour("session_start") == hour)).count())

    try:
        wait_for("gold to fold rounds 0 and 1", lambda: starts("cam-0001", 13) == 1)
        conf_file.write_text(conf_file.read_text().replace("session_gap: 30 minutes", "session_gap: 10 minutes"))
        new = config(tmp_path, LAKEHOUSE_CONF=str(conf_file))
        assert logic_hash(new) != logic_hash(old)
        done = refresh(spark, new, "gold", wait_s=240)
        assert "handing the checkpoint over to refresh " + done["id"] in log_path.read_text()
        # the refresh names the process it waits for, without the advice of a refused start
        (asked,) = [m for m in logged.messages if "asked it to hand its checkpoint over" in m]
        assert "(pid " in asked and "stop it first" not in asked, asked
        wait_for("the process to take gold back", lambda: "runs its logic from now on" in log_path.read_text(), 60)
        # the next round: cam-0001 at 14:00 and 14:20 is two sessions by the 10-minute gap
        land(new, 2)
        wait_for("the live gold to fold round 2", lambda: starts("cam-0002", 14) == 1 and starts("cam-0001", 14) == 2)
        writer, _ = last_lineage(spark, sessions)
        _, switched = switch_version(spark, sessions)
        assert writer["query_id"] == done["query_id"] and writer["logic"]["hash"] == logic_hash(new)
        assert writer["batch_id"] > switched["batch_id"]    # a batch of the live process, after the switch
        stop_run_all(proc, log_path)
    finally:
        kill_run_all(proc)
    report = run_audit(spark, new)
    assert report["ok"], report["failures"]
    forget_names(spark)
