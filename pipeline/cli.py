"""Command line of the pipeline: every layer in one application, or one layer alone.

    python -m pipeline [--layer all|bronze|silver|gold] [--trigger ...] [--interval ...]
                       [--source files|kafka] [--only sightings,activity,...]
    lakehouse run all|bronze|silver|gold [--trigger ...] ...

make run-all runs `--layer all`; make run-bronze|run-silver|run-gold run one layer (for teams
that deploy layers apart): the same runner, the same semantics and checkpoint locks.
Exit codes: 0 done or stopped cleanly; 1 a query failed (its name, and the expectation when a
`fail` rule stopped it, are printed); 2 something to fix first (config, suite, missing input,
a checkpoint held by another process).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from common.flow import ORDER

LAYER_CHOICES = ("all", *ORDER)
log = logging.getLogger(__name__)


def parser(prog: str = "pipeline", layer: str | None = None) -> argparse.ArgumentParser:
    """layer None: --layer picks it; else fixed (`lakehouse run all`, `python -m silver.job`)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if layer is None:
        p.add_argument("--layer", choices=LAYER_CHOICES, default="all",
                       help="run every layer in one application (default) or one layer alone")
    p.add_argument("--trigger", choices=["available-now", "processing-time"],
                   help="available-now (default: conf streaming.trigger / env TRIGGER) processes what "
                        "is there and stops; processing-time runs until SIGINT/SIGTERM")
    p.add_argument("--interval", help="processing-time interval for every layer, e.g. '10 seconds'")
    if layer in (None, "all", "bronze"):
        p.add_argument("--source", choices=["files", "kafka"],
                       help="bronze's source (default: conf bronze.source / env SOURCE)")
    if layer in (None, "all", "gold"):
        p.add_argument("--only", help="comma-separated subset of the profile's gold tables, by key "
                                      "(nest: sightings, activity, sessions; default: all)")
    return p


# flag -> the config key it sets (flag > environment > profile > file)
FLAG_KEYS = {"trigger": "streaming.trigger", "interval": "streaming.trigger_interval", "source": "bronze.source"}


def overrides(args) -> dict:
    """The config values the flags given set, each naming its flag (a bad value is reported
    "(value from command-line flag --interval)"). The process environment is left alone."""
    from common.config import Override

    return {key: Override(getattr(args, flag), f"command-line flag --{flag}")
            for flag, key in FLAG_KEYS.items() if getattr(args, flag, None)}


def only_keys(args) -> set[str] | None:
    """--only's table keys; None when the flag is absent (every table). Blanks around commas are
    ignored; a flag that names no key stays an empty set, which gold's select refuses."""
    text = getattr(args, "only", None)
    return None if text is None else {k.strip() for k in text.split(",") if k.strip()}


def main(argv=None, layer: str | None = None, spark=None, env=None, prog: str | None = None) -> int:
    from common.config import ConfigError, load_config
    from common.log import configure
    from common.quality import SuiteError
    from pipeline.runner import Runner, declare

    args = parser(prog or (f"{layer}.job" if layer else "pipeline"), layer).parse_args(argv)
    configure()
    chosen = layer or args.layer
    layers = ORDER if chosen == "all" else (chosen,)
    only = only_keys(args)
    try:
        cfg = load_config(env=env, overrides=overrides(args))
        if spark is None:
            from common.spark import prelaunch_jvm

            prelaunch_jvm(cfg)       # while the layers are declared and their checkpoints locked
        specs = declare(cfg, layers, {"gold": {"only": only}})
    except (ConfigError, SuiteError) as e:
        log.error(str(e))
        return 2
    runner = Runner(cfg, specs, spark=spark, reload=lambda: load_config(env=env, overrides=overrides(args)))
    if spark is None:
        runner.install_signals()
    return runner.run()


def layer_main(layer: str) -> int:
    """`python -m <layer>.job`: the runner with that one layer selected."""
    return main(layer=layer)


def exit_now(code: int):
    """End the process with `code` once main() has returned: Spark stopped, locks released.
    Python's own teardown after that (the GX, pandas and pyarrow modules, Py4J's threads) took
    0.7 s of every run and does nothing a finished run needs. Logs are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
