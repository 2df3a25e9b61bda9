"""One run of the pipeline: the selected layers' flows as streaming queries of one Spark application.

available-now: layer after layer (bronze, then silver, then gold), each layer's flows at once; a
layer starts when the one it reads has committed everything, so it sees all of it.
processing-time: every flow at once, each in its layer's FAIR pool, until SIGINT/SIGTERM.

Failure policy, per flow:
- the flow's own recovery first (bronze's Kafka query restarts once the broker answers);
- a `fail` expectation stops the flow's layer and every layer reading from it; the layers above
  keep running; the run exits 1 naming the query and the expectation;
- any other failure stops every flow (between micro-batches) and the run exits 1 naming the query;
- a problem the user can fix before anything runs (no landing folder, no upstream table, a
  checkpoint held by another process) exits 2 before Spark starts.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

from common.log import fields
from common.flow import ORDER, Flow, Layer

log = logging.getLogger(__name__)

POLL_S = 0.5
REFRESHED = ("silver", "gold")      # the layers `lakehouse refresh` rebuilds (pipeline/handover.py)


class FlowRun:
    """One flow's query on its own thread: start, await, recover, stop between batches."""

    def __init__(self, spark, flow: Flow, done: queue.Queue, stop_all: threading.Event, checkpoint: str,
                 handover=None):
        self.spark, self.flow, self.done, self.stop_all = spark, flow, done, stop_all
        self.checkpoint = checkpoint
        self.handover = handover                # a refresh may ask for the checkpoint (pipeline/handover.py)
        self.stop = threading.Event()           # this flow only (a failed upstream, a quality stop)
        self.error: BaseException | None = None
        self.query = None
        self.body = None                        # the foreachBatch body the query runs (Started.body)
        self.thread = threading.Thread(target=self._run, name=f"flow-{flow.name}", daemon=True)

    def _stopping(self) -> bool:
        return self.stop.is_set() or self.stop_all.is_set()

    def failure(self):
        """The typed error (a LakehouseError) the body of this run's query kept from its batch,
        if any: Spark's own error carries only its text."""
        kept = getattr(self.body, "failure", None)
        return None if kept is None else kept.error

    def _run(self) -> None:
        from common.errors import DataQualityError
        from common.streaming import clear_interrupted_first_batch, stop_between_batches

        try:
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.flow.layer)
            cleared = clear_interrupted_first_batch(self.checkpoint)     # the runner holds its lock
            if cleared:
                log.info(f"{self.flow.name}: removed {len(cleared)} file(s) of a first batch that a killed "
                         f"run did not finish logging: {', '.join(cleared)}")
            self.query, self.body = self.flow.start(self.spark)
            recovery = self.flow.recovery() if self.flow.recovery else None
            while True:
                try:
                    while self.query.isActive:
                        self.query.awaitTermination(POLL_S)
                        if self._stopping():
                            stop_between_batches(self.query)
                        elif self.handover is not None and self.handover.asked(self.flow.name):
                            flow = self.handover.lend(self)
                            if flow is None:
                                self.stop.set()        # a stop of its own: the other flows go on
                                return
                            self.flow = flow
                            recovery = self.flow.recovery() if self.flow.recovery else None
                            self.query, self.body = self.flow.start(self.spark)
                    self.query.awaitTermination()      # raises if it failed
                    return
                except Exception as e:
                    if (recovery is None or self._stopping()
                            or isinstance(self.failure(), DataQualityError)):
                        raise
                    resumed = recovery.resume(self.spark, e, self.query, self)
                    if resumed is None:
                        return
                    self.query, self.body = resumed
        except BaseException as e:   # noqa: BLE001 - handed to the runner, which decides
            self.error = e
            if self.query is not None and self.query.isActive:
                self.query.stop()
        finally:
            self.done.put(self)


class Maintainer:
    """Processing-time runs maintain their own tables (compaction, VACUUM, ops retention) every
    conf maintenance.interval, on a thread of the application, in the `maintenance` FAIR pool.
    The ops tables are shared by every layer: only a run of the whole pipeline maintains them,
    so layers deployed apart never compact the same table at once."""

    def __init__(self, spark, cfg, layers: list[str]):
        self.spark, self.cfg = spark, cfg
        self.layers = set(layers) | ({"ops"} if set(ORDER) <= set(layers) else set())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="maintenance", daemon=True)

    def _run(self) -> None:
        from common.errors import describe
        from pipeline.maintenance import maintain, summary, tables_of

        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "maintenance")
        interval = self.cfg.maintenance.interval
        vacuumed = time.monotonic()
        while not self.stop.wait(interval.seconds):
            started = time.monotonic()
            # VACUUM can delete only what was removed longer than the horizon ago: a quarter of
            # the horizon between runs is enough. LITE reads the log instead of listing every
            # file (a FULL one took about 14 s a table here, beside the running queries).
            vacuum = started - vacuumed >= self.cfg.maintenance.audit_horizon.seconds / 4
            try:
                results = maintain(self.spark, self.cfg, tables_of(self.cfg, self.layers),
                                   vacuum="lite" if vacuum else None)
                vacuumed = started if vacuum else vacuumed
                took = time.monotonic() - started
                log.info(summary(results, took), extra=fields(
                    event="maintenance", tables=len(results), seconds=round(took, 2),
                    compacted=sum(r.compacted for r in results), vacuum=bool(vacuum)))
            except Exception as e:   # noqa: BLE001 - the queries go on; the next round tries again
                log.warning(f"maintenance failed, next try in {interval}: {describe(e)}")


class PreparedAhead:
    """Every layer's set-up ahead of its run, while the layers before it run: in available-now
    mode silver's and gold's tables (seconds of small Delta commits) do not wait for bronze to
    finish. A layer's `prepare_alone` (silver: the dimension's seed, its longest part) needs no
    other table and starts at once. Its `prepare` needs the tables of the layer it reads (gold
    reads silver's schema) and starts once that layer's set-up is done: started beside bronze's,
    silver's tables slowed bronze's set-up on 2 cores by as much as they gained."""

    def __init__(self, spark, layers: list[Layer]):
        self.spark, self.layers = spark, layers
        self.ready = {layer.name: threading.Event() for layer in layers}
        self.errors: dict[str, BaseException] = {}
        self.alone: dict[str, threading.Thread] = {}
        for layer in layers:
            self.alone[layer.name] = threading.Thread(target=self._prepare_alone, args=(layer,),
                                                      name=f"prepare-alone-{layer.name}", daemon=True)
            self.alone[layer.name].start()
            threading.Thread(target=self._prepare, args=(layer,), name=f"prepare-{layer.name}",
                             daemon=True).start()

    def _prepare_alone(self, layer: Layer) -> None:
        try:
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", layer.name)
            layer.prepare_alone(self.spark)
        except BaseException as e:   # noqa: BLE001 - raised where the layer waits for it
            self.errors.setdefault(layer.name, e)

    def _prepare(self, layer: Layer) -> None:
        try:
            upstream = self.ready.get(layer.reads)
            if upstream is not None:
                upstream.wait()
                if layer.reads in self.errors:     # nor can the layers after it be prepared
                    self.errors[layer.name] = self.errors[layer.reads]
                    return
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", layer.name)
            layer.prepare(self.spark)
        except BaseException as e:   # noqa: BLE001 - raised where the layer waits for it
            self.errors.setdefault(layer.name, e)
        finally:
            self.alone[layer.name].join()
            self.ready[layer.name].set()

    def wait(self, name: str) -> None:
        """Block until this layer's tables and those of every layer before it are ready; raise
        what the first failed prepare among them raised."""
        for layer in self.layers:
            self.ready[layer.name].wait()
            if layer.name in self.errors:
                raise self.errors[layer.name]
            if layer.name == name:
                return


class Validation:
    """Every layer's validate (its GX suites: importing Great Expectations alone takes 2-3 s of
    Python) on a thread of its own, while the main thread starts the Spark session. `result`
    raises what a check raised; the runner calls it before it starts any flow."""

    def __init__(self, layers: list[Layer]):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(layers,), name="validate", daemon=True)
        self.thread.start()

    def _run(self, layers: list[Layer]) -> None:
        try:
            for layer in layers:
                layer.validate()
        except BaseException as e:   # noqa: BLE001 - raised in the runner's thread
            self.error = e

    def result(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def downstream(layers: list[Layer], name: str) -> set[str]:
    """The layer and every selected layer that reads from it, directly or not."""
    hit = {name}
    for layer in layers:                 # layers are in ORDER, so one pass follows the chain
        if layer.reads in hit:
            hit.add(layer.name)
    return hit


def preflight_problems(layers: list[Layer], selected=None) -> list[str]:
    """What stops a run before Spark starts, every layer's: the table it reads, when the layer
    writing that one is not `selected` too (default: `layers`), must be there; then the layer's
    own checks (its source). Every problem, each naming its path or setting."""
    from common.errors import JobError
    from common.storage import is_delta_table

    selected = {layer.name for layer in layers} | set(selected or ())
    problems = []
    for layer in layers:
        try:
            if layer.reads_table and layer.reads not in selected and not is_delta_table(layer.reads_table):
                problems.append(f"{layer.reads} table {layer.reads_table} does not exist yet: "
                                f"run `make run-{layer.reads}` first")
            layer.preflight()
        except JobError as e:
            problems.append(str(e))
    return problems


def preflight(layers: list[Layer]) -> None:
    """preflight_problems, raised as one JobError listing them all."""
    from common.errors import JobError

    problems = preflight_problems(layers)
    if len(problems) == 1:
        raise JobError(problems[0])
    if problems:
        raise JobError(f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))


def declare(cfg, names, options: dict[str, dict] | None = None) -> list[Layer]:
    """The Layers of the named layers, in pipeline order. `options`: layer name -> keyword
    arguments of its `layer()` (bronze: source; silver: suite; gold: only, suites)."""
    from bronze.job import layer as bronze
    from gold.job import layer as gold
    from silver.job import layer as silver

    builders = {"bronze": bronze, "silver": silver, "gold": gold}
    options = options or {}
    return [builders[name](cfg, **options.get(name, {})) for name in ORDER if name in names]


def start(spark, cfg, name: str, **options) -> list:
    """One layer's queries started on `spark` the way a run starts them (preflight, its checks,
    its tables), for tests and benches that drive queries themselves: returns the started
    queries, which the caller awaits or stops. No checkpoint lock, no supervision, no recovery:
    that is `Runner`. `options` go to the layer's `layer()` (see declare)."""
    layers = declare(cfg, [name], {name: options})
    preflight(layers)
    for layer in layers:
        layer.validate()
        layer.prepare_alone(spark)
        layer.prepare(spark)
    return [flow.start(spark).query for layer in layers for flow in layer.flows]


class Runner:
    def __init__(self, cfg, layers: list[Layer], spark=None, reload=None):
        self.cfg, self.layers = cfg, layers
        self.reload = reload            # the config loaded again as at the start (pipeline/handover.py)
        self.spark, self._own_spark = spark, spark is None
        self.stop_all = threading.Event()
        self.failures: list[tuple[str, int]] = []      # (message, exit code)
        self.validation: Validation | None = None
        self.locks = None                               # the CheckpointLocks run() holds
        self._signals = False                           # install_signals() was called

    # --- signals: one handler for the whole application ---
    def request_stop(self, signum=None, _frame=None) -> None:
        import signal

        if self.stop_all.is_set():     # a second signal: stop now, the checkpoints keep us safe
            raise KeyboardInterrupt
        name = signal.Signals(signum).name if signum else "stop"
        log.info(f"pipeline: {name}: stopping every query after its current micro-batch")
        self.stop_all.set()

    def install_signals(self) -> None:
        import signal

        self._signals = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.request_stop)

    # --- the run ---
    def run(self) -> int:
        from common.checkpoint_lock import CheckpointLocks
        from common.errors import JobError

        try:
            with CheckpointLocks(self.cfg, [q for layer in self.layers for q in layer.queries]) as locks:
                self.locks = locks
                from pipeline import root_owner

                wrong_root = root_owner.problem(self.cfg)
                if wrong_root:
                    raise JobError(wrong_root)
                preflight(self.layers)
                root_owner.claim(self.cfg)
                self.validation = Validation(self.layers)
                return self._run_locked()
        except JobError as e:
            log.error(str(e))
            return e.exit_code

    def _run_locked(self) -> int:
        from common.progress import ProgressRecorder
        from common.spark import build_spark

        if self.spark is None:
            names = "+".join(layer.name for layer in self.layers)
            self.spark = build_spark(self.cfg, f"{self.cfg.spark.app_name}:{names}")
            if self._signals:
                # PySpark's SparkContext takes SIGINT as it starts (it cancels every job and
                # raises KeyboardInterrupt): Ctrl-C stops after the current batches, as SIGTERM.
                self.install_signals()
        recorder = ProgressRecorder(self.spark, self.cfg)
        self.spark.streams.addListener(recorder)
        try:
            # A checkpoint whose state no longer fits its flow: named now, not by Spark mid-run.
            from pipeline.checks import raise_any, state_problems

            raise_any(state_problems(self.spark, self.cfg, self.layers))
            if self.cfg.streaming.trigger == "available-now":
                self._available_now()
            else:
                self._continuous()
        finally:
            try:
                for layer in self.layers:
                    layer.settle()
                recorder.close()
                self.spark.streams.removeListener(recorder)
            finally:
                if self._own_spark:
                    from common.spark import stop as stop_spark

                    stop_spark(self.spark)
        for line, _ in self.failures:
            log.error(line)
        return max((code for _, code in self.failures), default=0)

    def _handover(self):
        """Silver's and gold's flows hand their checkpoint over to a refresh that asks (a run that keeps
        going; local checkpoints, as the refresh)."""
        from common.storage import ObjectPath, location
        from pipeline.handover import HandOver

        if (self.cfg.streaming.trigger == "available-now" or self.locks is None
                or isinstance(location(str(self.cfg.checkpoint_root)), ObjectPath)):
            return None
        return HandOver(self.cfg, self.locks, [f.name for layer in self.layers if layer.name in REFRESHED
                                               for f in layer.flows], self.reload)

    def _start(self, layers: list[Layer], done: queue.Queue) -> list[FlowRun]:
        if self.validation is not None:   # a bad suite: exit 2 before any query starts
            self.validation.result()
        runs, handover = [], self._handover()
        for layer in layers:
            for flow in layer.flows:
                run = FlowRun(self.spark, flow, done, self.stop_all, self.cfg.checkpoint(flow.name),
                              handover if layer.name in REFRESHED else None)
                run.thread.start()
                runs.append(run)
            log.info(f"{layer.name}: {layer.describe} ({self.cfg.streaming.trigger})",
                     extra=fields(event="layer_started", layer=layer.name, trigger=self.cfg.streaming.trigger))
        return runs

    def _available_now(self) -> None:
        ahead = PreparedAhead(self.spark, self.layers)
        for layer in self.layers:
            if self.stop_all.is_set():
                return
            ahead.wait(layer.name)
            done: queue.Queue = queue.Queue()
            started = time.monotonic()
            runs = self._start([layer], done)
            self._supervise(runs, done)
            if self.failures:
                return
            rows = sum(p.numInputRows for run in runs for p in (run.query.recentProgress if run.query else []))
            took = time.monotonic() - started
            log.info(f"{layer.name}: done in {took:.1f} s, {rows:,} rows read",
                     extra=fields(event="layer_done", layer=layer.name, seconds=round(took, 2), rows=rows))

    def _continuous(self) -> None:
        ahead = PreparedAhead(self.spark, self.layers)
        for layer in self.layers:         # every layer's tables exist before any query starts
            ahead.wait(layer.name)
        done: queue.Queue = queue.Queue()
        runs = self._start(self.layers, done)
        maintainer = None
        if self.cfg.maintenance.enabled:
            maintainer = Maintainer(self.spark, self.cfg, [layer.name for layer in self.layers])
            maintainer.thread.start()
        try:
            self._supervise(runs, done)
        finally:
            if maintainer is not None:
                maintainer.stop.set()
                maintainer.thread.join()
        if not self.failures:
            log.info("pipeline: every query stopped cleanly")

    def _supervise(self, runs: list[FlowRun], done: queue.Queue) -> None:
        """Wait for every flow's thread; apply the failure policy as flows end."""
        from common.errors import DataQualityError, QueryFailed, exit_code

        layer_of = {run.flow.name: run.flow.layer for run in runs}
        left = len(runs)
        while left:
            try:
                run = done.get(timeout=POLL_S)
            except queue.Empty:
                continue
            left -= 1
            name = run.flow.name
            if run.error is None:
                if self.cfg.streaming.trigger != "available-now" and not (run.stop.is_set() or self.stop_all.is_set()):
                    self.failures.append((f"query {name} stopped on its own", 1))
                    self.stop_all.set()
                continue
            typed = run.failure()
            if isinstance(typed, DataQualityError):
                quality = typed
                hit = downstream(self.layers, layer_of[name])
                stopped = ", ".join(layer for layer in ORDER if layer in hit)
                self.failures.append((f"{quality}\n  stopped: {stopped} ({quality.summary()})", 1))
                for other in runs:
                    if other.flow.layer in hit:
                        other.stop.set()
            else:
                # The batch's own typed error if it raised one; else the query's (Spark's) error.
                error = typed or run.error
                self.failures.append((str(QueryFailed(name, error)), exit_code(error)))
                self.stop_all.set()
        for run in runs:
            run.thread.join()
