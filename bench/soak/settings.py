"""The soak's options and the job environment they make: conf defaults for what the command
line leaves out, a fresh lakehouse per run, retention compressed like event time."""
from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone
from pathlib import Path

from common.errors import JobError


class UsageError(JobError, ValueError):
    pass


def soak_overrides(soak, maintenance: bool) -> dict[str, str]:
    """Retention compressed like event time, so one soak exercises log cleanup, VACUUM and
    checkpoint cleanup; with --no-maintenance nothing compacts or vacuums."""
    m = "LAKEHOUSE__MAINTENANCE__"
    env = {f"{m}AUDIT_HORIZON": soak.retention.text, f"{m}LOG_RETENTION": soak.retention.text,
           f"{m}OPS_RETENTION": soak.retention.text, f"{m}INTERVAL": soak.maintenance_interval.text,
           f"{m}MIN_BATCHES_TO_RETAIN": str(soak.min_batches_to_retain),
           f"{m}ENABLED": str(maintenance).lower()}
    if not maintenance:
        env[f"{m}AUTO_COMPACT"] = "false"
    return env


SAMPLES = 12        # a run shorter than this many conf sample intervals is sampled this often


def settings(argv, prog: str, description: str) -> tuple[argparse.Namespace, dict, object]:
    """Options with conf defaults, the job environment and its config; UsageError when bad."""
    from common.config import ConfigError, load_config, parse_duration

    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, help="how long to feed and sample (default: soak.minutes)")
    p.add_argument("--rate", type=int, help="events per second landed (default: soak.rate)")
    p.add_argument("--no-maintenance", action="store_true",
                   help="no OPTIMIZE/VACUUM and no auto compaction, to compare files per table")
    p.add_argument("--sample-interval", help="e.g. '15 seconds' (default: soak.sample_interval, or a "
                                             f"{SAMPLES}th of a run too short for {SAMPLES} of those)")
    p.add_argument("--warmup", help="samples before this are charted, not judged (default: soak.warmup, "
                                    "at most a third of the run)")
    p.add_argument("--out", help="results folder (default: soak.out)")
    p.add_argument("--seed", type=int, default=7, help="generator seed (default 7)")
    p.add_argument("--keep", action="store_true", help="keep the lakehouse after a passing soak")
    args = p.parse_args(argv)
    try:
        base = load_config()
        soak = base.soak
        args.minutes = soak.minutes if args.minutes is None else args.minutes
        args.rate = soak.rate if args.rate is None else args.rate
        args.interval = parse_duration(args.sample_interval) if args.sample_interval else soak.sample_interval
        warmup = parse_duration(args.warmup) if args.warmup else soak.warmup
    except (ConfigError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.minutes <= 0 or args.rate <= 0:
        raise UsageError("--minutes and --rate must be positive")
    if base.profile.name != "nest":
        raise UsageError(f"the soak feeds the nest generator's events; PROFILE={base.profile.name} does not read them")
    run_s = args.minutes * 60
    if not args.sample_interval and args.interval.seconds * SAMPLES > run_s:
        # `make soak MINUTES=2`: as many samples as a default run has at least, not an error.
        args.interval = parse_duration(f"{run_s / SAMPLES:g} seconds")
    if args.interval.seconds * 4 > run_s:
        raise UsageError(f"--sample-interval {args.interval} leaves fewer than 4 samples in {args.minutes:g} "
                         f"min: give a shorter one, or leave it out ({SAMPLES} samples in a short run)")
    # A short run keeps two thirds of its samples for judging, halves of a few samples each.
    args.warmup_s = min(warmup.seconds, run_s / 3)
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    args.run_dir = Path(args.out or soak.out).resolve() / (stamp + ("-no-maintenance" if args.no_maintenance else ""))
    env = {k: v for k, v in os.environ.items() if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR")}
    env.update(LAKEHOUSE_ROOT=str(args.run_dir / "lakehouse"), TRIGGER="processing-time", SOURCE="files",
               **soak_overrides(soak, not args.no_maintenance))
    try:
        cfg = load_config(env=env)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return args, env, cfg
