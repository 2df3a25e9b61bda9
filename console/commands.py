"""`lakehouse`: one console command for the pipeline and every tool around it.

Each tool keeps its own argparse parser and `main(argv, prog=...)` (also run as `python -m <module>`
and by the Makefile); a command here forwards its arguments, `--help` included, to that main with
prog `lakehouse <command>`, and exits with the tool's exit code. Only `run` parses one argument
itself, the layer. The group's options configure logging for the whole process (common.log) and
are passed on in LOG_LEVEL / LOG_JSON to the processes the tools start.
"""
from __future__ import annotations

import importlib
import os

import click

from common import log

# command -> (module whose main(argv, prog=...) it runs, or module:function, the one line
# `lakehouse --help` shows)
TOOLS = {
    "generate": ("tools.generator.events", "Write N generated events to landing files or Kafka."),
    "locations": ("silver.locations", "Merge a locations file into the dimension's history."),
    "seed-locations": ("silver.locations:seed_main", "Load the reference locations file (locations load)."),
    "sql": ("tools.sql", "Run SQL over the tables; no query: a spark-sql shell."),
    "status": ("tools.status", "Each streaming query: last batch, rates, lag, state."),
    "graph": ("pipeline.graph", "Each flow: source -> transform -> sink, checkpoint, suite."),
    "check": ("pipeline.check", "Dry run: every problem a run would meet."),
    "state": ("pipeline.state", "Open sessions and dedup keys held in state now."),
    "report": ("console.report", "PNG charts, the flows' graph and index.html."),
    "dq-docs": ("tools.dq_docs", "Great Expectations Data Docs of the recorded gate results."),
    "audit": ("audit.__main__", "Audit every table: history, gold prefixes, accounting."),
    "diff": ("audit.diff", "Rows added and removed between two table versions."),
    "changes": ("audit.changes", "A table's change feed: inserts, updates, deletes."),
    "restore": ("audit.restore", "Roll a table back to a version (asks first)."),
    "backfill": ("gold.backfill", "Fold the kept late events into the gold rows they belong to."),
    "refresh": ("pipeline.refresh", "Rebuild gold, or silver and gold, beside the live tables."),
    "maintain": ("pipeline.maintenance", "Compact and VACUUM every table, trim the ops tables."),
    "chaos": ("chaos.__main__", "kill -9 the pipeline at random points, then audit."),
    "bench": ("bench.run", "Throughput, incremental cost, latency and state bench."),
    "bench-audit": ("bench.audit_versions", "Time the audit of a gold table with many versions."),
    "soak": ("bench.soak.__main__", "The pipeline at a steady feed; fails if a series grows."),
    "kafka": ("tools.kafka_broker", "The local Kafka broker: up, down, status."),
    "s3": ("tools.s3_server", "The local S3-compatible server: up, down, status, env."),
    "class-archive": ("pipeline.class_archive", "Build the driver JVM's class-data sharing archive."),
}
LAYERS = ("all", "bronze", "silver", "gold")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", type=click.Choice(log.LEVELS, case_sensitive=False), envvar="LOG_LEVEL",
              default="INFO", show_default=True, help="Log level of every job and tool (env LOG_LEVEL).")
@click.option("--log-json/--no-log-json", envvar="LOG_JSON", default=False,
              help="One JSON object per log line: time, level, logger, message and the record's "
                   "fields (env LOG_JSON=1).")
def lakehouse(log_level: str, log_json: bool) -> None:
    """Streaming Delta Lake lakehouse: bronze -> silver -> gold on Spark, and the tools around it.

    `lakehouse COMMAND --help` shows a command's options.
    """
    level = log_level.upper()
    os.environ.update(LOG_LEVEL=level, LOG_JSON="1" if log_json else "0")
    log.configure(level, log_json, force=True)


@lakehouse.command(short_help="Run bronze, silver, gold, or all in one application.",
                   context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("layer", type=click.Choice(LAYERS))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx, layer: str, args: tuple[str, ...]) -> None:
    """Run LAYER (all: bronze, then silver, then gold, in one Spark application).

    `lakehouse run LAYER --help` lists the options (trigger, interval, source, gold tables).
    """
    from pipeline.cli import main

    ctx.exit(main(list(args), layer=layer, prog=f"lakehouse run {layer}") or 0)


def forwarding(name: str, module: str, summary: str) -> click.Command:
    """A command that hands its arguments, --help included, to `module`'s main."""

    @click.pass_context
    def forward(ctx, args: tuple[str, ...]) -> None:
        name_, _, function = module.partition(":")
        main = getattr(importlib.import_module(name_), function or "main")
        ctx.exit(main(list(args), prog=f"lakehouse {name}") or 0)

    return click.Command(name, callback=forward, short_help=summary, help=summary, add_help_option=False,
                         params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
                         context_settings={"ignore_unknown_options": True})


for _name, (_module, _summary) in TOOLS.items():
    lakehouse.add_command(forwarding(_name, _module, _summary))
