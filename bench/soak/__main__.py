"""make soak: the one-application pipeline at a steady feed for a while, sampled every minute.

    python -m bench.soak [--minutes 30] [--rate 200] [--no-maintenance] [--sample-interval '1 minute']
                         [--warmup '3 minutes'] [--out ./soak-results] [--seed 7] [--keep]

A fresh lakehouse under <out>/<UTC time>/lakehouse; the generator's events landed one file a
second at --rate, their event time running soak.event_time_speedup times faster than the clock
so windows, sessions and watermarks close within minutes; retention compressed the same way
(soak.retention, maintenance every soak.maintenance_interval). Every sample: driver RSS and
JVM heap, batches per query, state, files and bytes per table, Delta log, checkpoint folders.
At the end the pipeline stops cleanly and the audit runs in the same session.

Judged (exit 1 when one fails): every series marked judged in KINDS, second-half mean against
first-half mean over the samples after its settle time; live files per table at the end
against soak.max_files_per_table; the pipeline ran to the end; the audit passed.
Exit 0 pass, 1 a check failed, 2 usage or config error.
Writes samples.json, <kind>.png charts and index.html in the run folder.
"""
from __future__ import annotations

import sys

from bench.soak.settings import settings
from common.errors import command


@command
def main(argv=None, prog: str = "python -m bench.soak") -> int:
    args, env, cfg = settings(argv, prog, __doc__)
    # Only now: --help and a usage error (exit 2) need neither Spark nor matplotlib.
    from bench.soak.run import run

    return run(args, env, cfg)


if __name__ == "__main__":
    sys.exit(main())
