"""make chaos: kill -9 bronze, silver and gold at random points while data arrives, then prove
nothing was lost or duplicated.

    python -m chaos [--kills 10] [--seed N] [--root DIR] [--report FILE]

The pipeline runs on processing-time triggers while landing files keep arriving in waves: by
default as one `run-all` process (--mode app), or each layer as its own process (split), or
first the one and then the others (mixed). On a schedule drawn from --seed (printed first), a
process's whole tree (the Python driver and its JVM) is killed with SIGKILL and restarted at
once. After the last
kill: available-now bronze, silver and gold drain what is left, the audit (`make audit`'s
run_audit) runs, and every generated line and event is looked for in bronze and silver, both in
one Spark session of this process. Exit 0
when every check passes, 1 when one fails, 2 on a usage or setup error. The lakehouse is left
under --root (default: a new temporary folder) with each job run's log beside it.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from common.config import load_config
from common.errors import JobError, command


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


@command
def main(argv=None, prog: str = "chaos") -> int:
    from chaos.run import Settings

    d = Settings()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=_positive, default=d.kills, help=f"kill -9 count (default {d.kills})")
    parser.add_argument("--seed", type=int, help="seed of the schedule and the data (default: random, printed)")
    parser.add_argument("--root", help="lakehouse root to create, a folder or s3a://bucket/prefix (default: "
                                       "a new temp folder); must not exist or be empty")
    parser.add_argument("--logs", type=Path, help="folder for the job logs (default: beside a local root, "
                                                  "else a new temp folder)")
    parser.add_argument("--events-per-wave", type=_positive, default=d.events_per_wave,
                        help=f"camera events per landing wave (default {d.events_per_wave})")
    parser.add_argument("--feed-every", type=float, default=d.feed_every_s,
                        help=f"seconds between landing waves (default {d.feed_every_s:g})")
    parser.add_argument("--mode", choices=["app", "split", "mixed"], default=d.mode,
                        help="app (default): kill -9 the one pipeline process; split: each layer runs "
                             "as its own process and is killed on its own; mixed: the pipeline process "
                             "first, then the layers on their own, in one session")
    parser.add_argument("--report", type=Path, help="also write the summary as JSON to this file")
    args = parser.parse_args(argv)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    s = Settings(kills=args.kills, seed=seed, mode=args.mode, events_per_wave=args.events_per_wave,
                 feed_every_s=args.feed_every)
    from chaos.run import job_env

    root = args.root or str((Path(tempfile.mkdtemp(prefix="chaos-")) / "lakehouse").resolve())
    env = job_env(root, s)
    cfg = load_config(env=env)   # an s3a:// root needs the config's object store to be read
    root = cfg.root
    if root.exists() and any(root.iterdir()):
        raise JobError(f"{root} is not empty; chaos needs a fresh lakehouse root")
    logs = args.logs or (root.parent / f"{root.name}-chaos-logs" if isinstance(root, Path)
                         else Path(tempfile.mkdtemp(prefix="chaos-logs-")))
    summary = run(cfg, root, s, logs)
    text = json.dumps(summary, indent=2, default=str)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    _print_summary(summary)
    return 0 if summary["ok"] else 1


def run(cfg, root, s, logs: Path) -> dict:
    from chaos.checks import verify
    from chaos.feed import Feeder
    from chaos.run import UNITS, Session

    print(f"chaos: lakehouse {root}", flush=True)
    feeder = Feeder(cfg, s.seed, s.events_per_wave, s.files_per_wave, s.wave_span_s)
    try:
        outcome = Session(cfg, root, s, feeder, logs, say=lambda m: print(m, flush=True)).run()
    except RuntimeError as e:   # a job that never got going: nothing to audit
        print(f"chaos: {e}", file=sys.stderr)
        return {"seed": s.seed, "root": str(root), "kills": [], "kills_by_layer": {}, "ok": False,
                "unexpected_exits": [], "drain_exit": None, "waves": feeder.expected.waves,
                "chaos_seconds": None, "checks": [{"name": "kill phase", "ok": False, "detail": str(e)}]}
    summary = {"seed": s.seed, "root": str(root), "kills": [k.as_dict() for k in outcome.kills],
               "mode": s.mode,
               "kills_by_layer": {l: sum(k.layer == l for k in outcome.kills) for l in UNITS[s.mode]},
               "unexpected_exits": outcome.unexpected_exits, "drain_exit": outcome.drain_code,
               "drain_log": outcome.drain_log, "waves": feeder.expected.waves,
               "chaos_seconds": outcome.seconds}
    if outcome.drain_code != 0:
        summary.update(ok=False, checks=[{"name": "drain", "ok": False,
                                          "detail": f"exit {outcome.drain_code}; see {outcome.drain_log}"}])
        return summary
    from common.spark import session

    # The audit shares the checks' session: one JVM start after the drain instead of two.
    with session(cfg, "chaos-checks") as spark:
        print("chaos: audit", flush=True)
        code, report = _audit(spark, cfg)
        checks = verify(spark, cfg, feeder.expected, code, report)
    summary.update(checks=[c.as_dict() for c in checks.items], figures=checks.figures,
                   audit_exit=code, audit_seconds=(report or {}).get("seconds"),
                   audit_failures=(report or {}).get("failures"),
                   ok=checks.ok and not outcome.unexpected_exits)
    return summary


def _audit(spark, cfg) -> tuple[int, dict | None]:
    """`make audit`'s report and exit code (0 pass, 1 fail). An audit that raises is a failed
    check with its error printed, not a crashed chaos run: the other checks still report."""
    from audit.__main__ import run_audit

    try:
        report = run_audit(spark, cfg)
    except Exception as e:          # noqa: BLE001 - reported as the failed "audit passes" check
        print(f"chaos: the audit raised {type(e).__name__}: {e}", file=sys.stderr)
        return 2, None
    return (0 if report["ok"] else 1), report


def _print_summary(s: dict) -> None:
    print(f"\nchaos summary (seed {s['seed']}, rerun with --seed {s['seed']})")
    by_layer = ", ".join(f"{layer} {n}" for layer, n in s["kills_by_layer"].items())
    print(f"  kills: {len(s['kills'])}{f' ({by_layer})' if by_layer else ''}, "
          f"{s['waves']} landing waves, {s['chaos_seconds']} s until drained")
    for msg in s["unexpected_exits"]:
        print(f"  UNEXPECTED EXIT: {msg}")
    for k, v in (s.get("figures") or {}).items():
        if isinstance(v, dict):     # per query: the batches a check names
            v = "; ".join(f"{q} {b}" for q, b in v.items()) or "none"
        print(f"  {k}: {v}")
    for c in s.get("checks", []):
        print(f"  {'PASS' if c['ok'] else 'FAIL'}  {c['name']}: {c['detail']}")
    print("chaos: OK" if s["ok"] else "chaos: FAILED")


if __name__ == "__main__":
    sys.exit(main())
