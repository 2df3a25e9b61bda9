"""What a layer declares: its flows (one streaming query each) and the checks and tables around them.

A flow knows how to start its query on a session and, optionally, how to recover from a failure
of that query (bronze's Kafka source waits for the broker and restarts from the checkpoint).
The runner does everything else: locks, session, pools, signals, stopping, failure policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

ORDER = ("bronze", "silver", "gold")


class Started(NamedTuple):
    """What starting a flow returns: its streaming query and the foreachBatch body it runs
    (None for a sink without one). A body that keeps its batch's typed error (`failure`, a
    common.errors.KeptFailure) hands it to the runner this way, per run, not through a global."""
    query: Any
    body: Any = None


class Recovery:
    """A flow's answer to a failure of its query: `resume` returns the restarted flow (Started),
    None when it was told to stop, or raises.
    One instance per run of the flow, so it may keep state (e.g. when an outage began)."""

    def resume(self, spark, error, query, stop):  # pragma: no cover - interface
        raise error


class RestartOnSchemaChange(Recovery):
    """A query reading a Delta table whose schema grew while it ran (silver's schema contract
    evolving a column): Delta's streaming source stops it with a retryable DELTA_SCHEMA_CHANGED
    error, since a running plan cannot take the new column, and a new start of the flow reads
    the new schema from its checkpoint. A second such stop without a batch in between is
    raised: that is not a schema the restart can take."""

    def __init__(self, name: str, start: Callable):
        self.name, self.start = name, start
        self.restarted = None                   # the query the last restart started

    def resume(self, spark, error, query, stop):
        import logging

        if "DELTA_SCHEMA_CHANGED" not in str(error) or (query is self.restarted and not query.recentProgress):
            raise error
        logging.getLogger(__name__).warning(f"{self.name}: its source table's schema changed; restarting the "
                                            "query from its checkpoint with the new schema")
        started = self.start(spark)
        self.restarted = started.query
        return started


@dataclass(frozen=True)
class Flow:
    name: str                                   # the streaming query's name and checkpoint name
    layer: str
    start: Callable                             # start(spark) -> Started(query, body)
    recovery: Optional[Callable[[], Recovery]] = None


@dataclass(frozen=True)
class Layer:
    name: str
    reads: Optional[str]                        # the layer whose table it reads (None: outside)
    flows: tuple[Flow, ...]
    reads_table: Optional[str] = None           # that table's path: when `reads` does not run too,
                                                # the runner refuses to start unless it exists
    preflight: Callable = lambda: None          # before Spark starts; raises JobError
    prepare: Callable = lambda spark: None      # create its tables (idempotent)
    prepare_alone: Callable = lambda spark: None   # the part needing no other layer's tables: starts at once
    validate: Callable = lambda: None           # checks with heavy imports (GX suites); raise JobError.
                                                # They run while the session starts, before any flow
    describe: str = ""                          # "<source> -> <sink>" for the start line
    settle: Callable = lambda: None             # waits for what it started in the background (a
                                                # read-ahead's job) before the session stops

    @property
    def queries(self) -> list[str]:
        return [f.name for f in self.flows]
