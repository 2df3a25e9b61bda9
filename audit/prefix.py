"""Prefix integrity of a gold table: every version equals a batch job over the silver prefix
it consumed.

The stream's result at a version depends on more than the prefix: for sessions, the
micro-batch each event arrived in decides which id a session was born with, and the batch's
watermark decides what is finalized or closed (whether an event was too late is a fact of its
silver row, see gold.transform.late). All of that is in the commits'
lineage (common/lineage.py), and the silver version that added each row says which batch first
read it: silver's commits are keyed by the silver batch they wrote (their txn key), and each
silver row carries that batch id (see row_versions). The recompute then runs the gold
transforms the stream runs, in batch, over `silver VERSION AS OF <consumed version>`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from audit.history import Version, read_version
from common.lineage import closes_ms
from gold import transform as T
from gold.tables import GoldTable

SAMPLE = 5
ARRIVAL = "_arrival"
ROW_VERSION = "_row_version"


@dataclass
class Batch:
    """One micro-batch as its commit recorded it."""
    index: int                # position among the table's batches, in commit order
    upstream: int | None      # last silver version fully read (None: cut inside a version)
    watermark_ms: int         # what its rows are final or closed by (common.lineage.closes_ms)


@dataclass
class VersionCheck:
    version: int
    operation: str
    made_by: str
    upstream: int | None
    status: str               # PASS | FAIL | SKIP | VACUUMED (older than the audit horizon)
    expected_rows: int = 0
    actual_rows: int = 0
    missing: int = 0          # expected rows the table lacks
    unexpected: int = 0       # table rows the recompute does not produce
    missing_sample: list = field(default_factory=list)
    unexpected_sample: list = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def batch_lineages(history: list[Version], recorded: list[Version] = ()) -> list[dict]:
    """Lineage of every micro-batch of the table's query, in run order. A batch that read rows
    but changed nothing in the table (all its events late) made no commit there: its lineage is
    in `recorded`, the query's ops.batch_accounting commits. A no-data batch that changed nothing
    (a watermark that finalized nothing) is in neither; it read no event, so no recompute needs it.
    Batch ids restart with a new checkpoint, so checkpoints are ordered by their first commit."""
    found: dict[tuple, dict] = {}
    first_seen: dict[str, object] = {}
    for v in [*history, *recorded]:
        lin = v.lineage
        if lin is None:
            continue
        found.setdefault((lin["query_id"], lin["batch_id"]), lin)
        seen = first_seen.get(lin["query_id"])
        first_seen[lin["query_id"]] = v.timestamp if seen is None else min(seen, v.timestamp)
    return [found[k] for k in sorted(found, key=lambda k: (first_seen[k[0]], k[1]))]


def batches_of(history: list[Version], recorded: list[Version] = ()) -> tuple[list[Batch], dict[int, int | None]]:
    """The table's micro-batches, and for each version the batch whose result it should hold
    (None before the first batch). A replayed batch commits again with the same lineage; a commit
    made outside the pipeline holds whatever the batch before it produced."""
    lineages = batch_lineages(history, recorded)
    index = {(lin["query_id"], lin["batch_id"]): i for i, lin in enumerate(lineages)}
    batches = [Batch(i, lin["upstream"]["version"], closes_ms(lin))
               for i, lin in enumerate(lineages)]
    at_version: dict[int, int | None] = {}
    current = None
    for v in history:
        if v.lineage is not None:
            current = index[(v.lineage["query_id"], v.lineage["batch_id"])]
        at_version[v.version] = current
    return batches, at_version


def _case(column, branches: list[tuple[int, object]]):
    """CASE WHEN column <= bound THEN value ... for ascending bounds."""
    expr = None
    for bound, value in branches:
        expr = (F.when(column <= bound, F.lit(value)) if expr is None
                else expr.when(column <= bound, F.lit(value)))
    return expr if expr is not None else F.lit(None)


def with_arrival(silver: DataFrame, batches: list[Batch]) -> DataFrame:
    """Silver rows with the batch that first read them.
    A batch cut inside a silver version is skipped: its rows count as read by the next batch."""
    complete = [b for b in batches if b.upstream is not None and b.upstream >= 0]
    firsts, last_bound = [], -1
    for b in complete:
        if b.upstream > last_bound:          # batches that read nothing new add no branch
            firsts.append(b)
            last_bound = b.upstream
    rcv = F.col(ROW_VERSION)
    return silver.withColumn(ARRIVAL, _case(rcv, [(b.upstream, b.index) for b in firsts])).drop(ROW_VERSION)


TRACKED = "row tracking"


_STAMPS: dict[tuple[str, int], object] = {}      # (path, table version) -> row_versions
_READ_ONCE = threading.Lock()                     # _STAMPS, filled by one thread


def row_versions(spark, path: str):
    """row_versions_of the table as it is now, read once per table version (every gold table's
    check and its accounting ask; the checks run side by side, so the first reads and the
    others wait for it rather than read the same history again)."""
    from common.delta import table_version

    with _READ_ONCE:
        key = (path, table_version(spark, path))
        if key not in _STAMPS:
            _STAMPS[key] = row_versions_of(spark, path)
        return _STAMPS[key]


def row_versions_of(spark, path: str):
    """How silver_rows learns the silver version that added each row.

    TRACKED: the table has row tracking (silver tables created before it was dropped for its
    cost: every append rebuilt the table's state to find the next row id). Otherwise a dict
    {silver_batch_id: version}, from the keys of the commits that appended rows (the batch id is
    a column of every row, and OPTIMIZE keeps it). None when some commit's rows cannot be placed
    that way (an append without a key, two checkpoints' batch ids, a MERGE or a RESTORE):
    silver_rows then compares snapshots, slower and always right."""
    from delta.tables import DeltaTable

    from common.delta import NO_ROW_CHANGE, append_key, table_properties

    if table_properties(spark, path).get("delta.enableRowTracking") == "true":
        return TRACKED
    versions: dict[int, int] = {}
    apps = set()
    for r in (DeltaTable.forPath(spark, path).history()
              .select("version", "operation", "operationMetrics", "userMetadata").collect()):
        if r.operation in NO_ROW_CHANGE:      # a silver table's other commits are its appends
            continue
        if r.operation != "WRITE":
            return None
        if not int((r.operationMetrics or {}).get("numOutputRows") or 0):
            continue
        key = append_key(r.userMetadata)
        if not isinstance(key.get("version"), int) or key["version"] in versions:
            return None
        apps.add(key.get("app"))
        versions[key["version"]] = r.version
    return versions if len(apps) <= 1 else None


def silver_rows(spark, silver_path: str, version: int, batches: list[Batch], stamps) -> DataFrame:
    """silver VERSION AS OF `version`, each row with the silver version that added it
    (`stamps`: row_versions of the table)."""
    rows = read_version(spark, silver_path, version)
    if stamps == TRACKED:
        return rows.withColumn(ROW_VERSION, F.col("_metadata.row_commit_version"))
    if isinstance(stamps, dict):
        added = spark.createDataFrame([(b, v) for b, v in stamps.items() if v <= version],
                                      f"silver_batch_id LONG, {ROW_VERSION} LONG")
        # A batch with no key left is older than the log (log_retention cleaned its commit): -1
        # places its rows before every batch the history still knows, as row tracking would.
        return (rows.join(F.broadcast(added), "silver_batch_id", "left")
                .select(*rows.columns, F.coalesce(ROW_VERSION, F.lit(-1).cast("long")).alias(ROW_VERSION)))
    bounds = sorted({b.upstream for b in batches if b.upstream is not None and 0 <= b.upstream <= version})
    firsts, previous = [], None
    for bound in bounds:
        ids = read_version(spark, silver_path, bound).select("event_id").distinct()
        new = ids if previous is None else ids.join(previous, "event_id", "left_anti")
        firsts.append(new.withColumn(ROW_VERSION, F.lit(bound)))
        previous = ids
    if not firsts:
        return rows.withColumn(ROW_VERSION, F.lit(None).cast("long"))
    first_seen = firsts[0]
    for frame in firsts[1:]:
        first_seen = first_seen.unionByName(frame)
    return rows.join(first_seen, "event_id", "left")


class SilverPrefixes:
    """silver_rows at every silver version a gold table's batches consumed.

    When silver's rows only ever came by keyed appends (`stamps` is a dict, see row_versions_of:
    no commit removed or changed a row) and its schema did not change over those versions, the
    table at version v holds exactly the rows of its newest consumed version that were added at
    v or before. Silver is then read once, cached, and each prefix is a filter of the cache,
    instead of a scan of every file of each version (a gold table of n versions read about n^2/2
    silver files: most of a 50-version audit's time). Otherwise each prefix is read as it was."""

    def __init__(self, spark, silver_path: str, versions: list[int], batches: list[Batch], stamps):
        """`versions`: the silver versions that will be asked for."""
        self.spark, self.path, self.batches, self.stamps = spark, silver_path, batches, stamps
        self.cached = None
        if isinstance(stamps, dict) and versions:
            first, last = min(versions), max(versions)
            if read_version(spark, silver_path, first).schema == read_version(spark, silver_path, last).schema:
                self.cached = silver_rows(spark, silver_path, last, batches, stamps).persist()

    def at(self, version: int) -> DataFrame:
        if self.cached is None:
            return silver_rows(self.spark, self.path, version, self.batches, self.stamps)
        return self.cached.where(F.col(ROW_VERSION) <= version)

    def release(self) -> None:
        if self.cached is not None:
            self.cached.unpersist()


def on_time_events(silver_at_version: DataFrame, batches: list[Batch], watermark) -> DataFrame:
    # silver_at_version must carry ROW_VERSION (see silver_rows).
    """What the stream's on_time() let through (`watermark`: gold's, a Duration or None)."""
    rows = with_arrival(silver_at_version, batches)
    return rows if watermark is None else rows.where(~T.late(watermark.seconds))


# Versions compared per Spark job: one job for many versions instead of one each, while the
# plan (a scan and a recompute per version) stays small enough to plan quickly.
VERSIONS_PER_JOB = 12


def _tagged(expected: DataFrame, actual: DataFrame, tag: int = 0) -> DataFrame:
    """Both sides' rows, marked _e (expected) or _a (actual), and `tag` (_v) that keeps several
    comparisons apart in one aggregation."""
    cols = actual.columns
    return (expected.select(*cols).withColumn("_e", F.lit(1)).withColumn("_a", F.lit(0))
            .unionByName(actual.withColumn("_e", F.lit(0)).withColumn("_a", F.lit(1)))
            .withColumn("_v", F.lit(tag)))


def _groups(tagged: DataFrame, cols) -> DataFrame:
    """Rows grouped by comparison and every column (grouping treats NULLs as equal), counting
    copies on each side."""
    return tagged.groupBy("_v", *cols).agg(F.sum("_e").alias("_e"), F.sum("_a").alias("_a"))


def _totals(groups: DataFrame, by=()) -> DataFrame:
    return groups.groupBy(*by).agg(F.sum("_e").alias("e"), F.sum("_a").alias("a"),
                                   F.sum(F.greatest(F.col("_e") - F.col("_a"), F.lit(0))).alias("m"),
                                   F.sum(F.greatest(F.col("_a") - F.col("_e"), F.lit(0))).alias("u"))


def _settle(check: VersionCheck, totals) -> None:
    """Fill the counts from a _totals row (None: neither side has a row)."""
    e, a, m, u = (int(totals[k] or 0) for k in "eamu") if totals is not None else (0, 0, 0, 0)
    check.expected_rows, check.actual_rows, check.missing, check.unexpected = e, a, m, u
    check.status = "FAIL" if m or u else "PASS"


def compare(expected: DataFrame, actual: DataFrame, check: VersionCheck) -> VersionCheck:
    """Multiset comparison in one aggregation; groups where the counts differ are the diff."""
    cols = actual.columns
    groups = _groups(_tagged(expected, actual), cols)
    _settle(check, _totals(groups).first())
    if check.status == "FAIL":
        sample = lambda cond: [  # noqa: E731
            {k: v for k, v in r.asDict().items() if k not in ("_e", "_a", "_v")}
            for r in groups.where(cond).orderBy(*cols).limit(SAMPLE).collect()]
        check.missing_sample, check.unexpected_sample = sample("_e > _a"), sample("_a > _e")
    return check


def compare_many(pairs: list[tuple[DataFrame, DataFrame, VersionCheck]]) -> None:
    """`compare` for many versions, VERSIONS_PER_JOB of them per Spark job (versions whose
    tables have other columns are compared apart). A failing version is compared again on its
    own, for its diff sample."""
    by_columns: dict[tuple, list] = {}
    for pair in pairs:
        by_columns.setdefault(tuple(pair[1].columns), []).append(pair)
    for group in by_columns.values():
        for start in range(0, len(group), VERSIONS_PER_JOB):
            chunk = group[start:start + VERSIONS_PER_JOB]
            union = None
            for i, (expected, actual, _) in enumerate(chunk):
                t = _tagged(expected, actual, tag=i)
                union = t if union is None else union.unionByName(t)
            groups = _groups(union, list(chunk[0][1].columns))
            found = {r["_v"]: r for r in _totals(groups, ["_v"]).collect()}
            for i, (expected, actual, check) in enumerate(chunk):
                _settle(check, found.get(i))
                if check.status == "FAIL":
                    compare(expected, actual, check)


VACUUMED_NOTE = "older than the audit horizon ({}): its files may be vacuumed, not provable"


def epochs(history: list[Version]) -> list[list[Version]]:
    """The table's history cut before each refresh's switch (pipeline/refresh.py): a switch
    replaced the table's rows with a rebuild by another checkpoint, whose batches alone say which
    batch first read each silver row from then on."""
    out: list[list[Version]] = []
    for v in history:
        if not out or (v.lineage and v.lineage.get("refresh")):
            out.append([])
        out[-1].append(v)
    return out


def query_ids(versions: list[Version]) -> set:
    """The checkpoints whose batches made these versions."""
    return {v.lineage["query_id"] for v in versions if v.lineage}


def other_logic(versions: list[Version], today: str) -> dict[int, str]:
    """version -> the logic hash its rows follow, for the versions made with other logic than
    `today`'s (gold/tables.py logic_hash): a profile changed since. Commits of code that did not
    record it are taken to follow today's."""
    out, current = {}, None
    for v in versions:
        if v.lineage:
            current = (v.lineage.get("logic") or {}).get("hash")
        if current is not None and current != today:
            out[v.version] = current
    return out


OTHER_LOGIC_NOTE = ("made with other logic (hash {}) than today's profile ({}): recompute it with "
                    "that profile, or `lakehouse refresh gold` to rebuild the table with today's")


def check_table(spark, cfg, spec: GoldTable, path: str, history: list[Version],
                silver_path: str, recorded: list[Version] = (), too_old=lambda version, upstream: False
                ) -> list[VersionCheck]:
    """PASS/FAIL/SKIP for every version of one gold table (`recorded`: see batch_lineages),
    each refresh's versions from the batches of its own checkpoint (`epochs`).
    `too_old(version, upstream)`: the version, or the silver version it consumed, is older than
    the audit horizon, so VACUUM may have deleted files it needs: VACUUMED, not recomputed."""
    from gold.tables import logic_hash

    today = logic_hash(cfg)
    checks = []
    for part in epochs(history):
        ids = query_ids(part)
        mine = [v for v in recorded if v.lineage and v.lineage.get("query_id") in ids]
        checks += _check_epoch(spark, cfg, spec, path, part, silver_path, mine, too_old,
                               other_logic(part, today), today)
    return checks


def _check_epoch(spark, cfg, spec, path, history, silver_path, recorded, too_old, other, today):
    batches, at_version = batches_of(history, recorded)
    checks, recompute = [], []
    for v in history:
        k = at_version[v.version]
        batch = batches[k] if k is not None else None
        check = VersionCheck(v.version, v.operation, v.made_by,
                             batch.upstream if batch else -1, "SKIP")
        checks.append(check)
        if v.backfill:
            check.note = "late events backfilled after the batch before it"
        elif v.lineage is None and v.operation != "CREATE TABLE":
            check.note = "commit made outside the pipeline"
        if too_old(v, batch.upstream if batch else None):
            check.status, check.note = "VACUUMED", VACUUMED_NOTE.format(cfg.maintenance.audit_horizon)
        elif v.version in other:
            check.note = OTHER_LOGIC_NOTE.format(other[v.version], today)
        elif batch is not None and batch.upstream is None:
            check.note = ("its batch stopped inside a silver version (gold.max_files_per_trigger), "
                          "so no silver snapshot equals what it read")
        else:
            recompute.append((v, k, batch, check))
    backfills = backfilled(spark, cfg, history, at_version)
    consumed = sorted({b.upstream for _, _, b, _ in recompute if b is not None and b.upstream >= 0})
    prefixes = SilverPrefixes(spark, silver_path, consumed, batches, row_versions(spark, silver_path))
    try:
        empty = spark.read.format("delta").load(silver_path).limit(0).withColumn(ROW_VERSION, F.lit(0).cast("long"))
        pairs, expected_by_batch = [], {}
        for v, k, batch, check in recompute:
            folded = tuple(b for b in backfills if b.version <= v.version)
            if (k, folded) not in expected_by_batch:
                if batch is None or batch.upstream < 0:
                    events = on_time_events(empty, [], cfg.gold.watermark)
                else:
                    events = on_time_events(prefixes.at(batch.upstream), batches, cfg.gold.watermark)
                expected_by_batch[(k, folded)] = spec.expected(with_backfilled(events, folded), ARRIVAL,
                                                               batch.watermark_ms if batch else 0)
            pairs.append((expected_by_batch[(k, folded)], read_version(spark, path, v.version), check))
        compare_many(pairs)
    finally:
        prefixes.release()
    return checks


@dataclass(frozen=True)
class Backfilled:
    """A backfill's commit to the table (gold/backfill.py): from `version` on, the table also
    holds `events` (late silver rows), folded in after the batch of index `after`."""
    version: int
    id: str
    after: int
    events: object = field(compare=False, hash=False)


def backfilled(spark, cfg, history: list[Version], at_version: dict) -> list[Backfilled]:
    from common.late import TABLE

    found = [(v.version, v.backfill) for v in history if v.backfill]
    if not found:
        return []
    late = spark.read.format("delta").load(cfg.table_path("silver", TABLE))
    return [Backfilled(version, i, at_version[version],
                       late.where(F.col("backfilled_by") == i).dropDuplicates(["event_id"]))
            for version, i in found]


def with_backfilled(events: DataFrame, folded: tuple) -> DataFrame:
    """The on-time events and the backfilled ones, in the order gold folded them: a backfill's
    after its batch's (arrival indexes doubled, so each backfill fits between two batches)."""
    if not folded:
        return events
    out = events.withColumn(ARRIVAL, F.col(ARRIVAL) * 2)
    for b in folded:
        extra = b.events.withColumn(ARRIVAL, F.lit(2 * b.after + 1))
        # (silver may have gained columns since: the late copy lacks them, as NULLs)
        out = out.unionByName(extra.select(*[c for c in out.columns if c in extra.columns]),
                              allowMissingColumns=True)
    return out


def first_failure(checks: list[VersionCheck]) -> VersionCheck | None:
    return next((c for c in checks if c.status == "FAIL"), None)

