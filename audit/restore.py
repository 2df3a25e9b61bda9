"""Roll a lakehouse table back to an earlier Delta version (Delta RESTORE).

    python -m audit.restore gold.zip_hourly_sightings 3          # shows the plan, asks y/N
    python -m audit.restore silver.camera_events 10 --yes

Before restoring it prints what changes (versions, row counts, the commits undone) and what the
restore means for the streaming queries that read or write the table. RESTORE is itself a new
commit: the history is kept, and restoring again to the version before it undoes it.
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap

from common.config import load_config
from common.errors import JobError, command, describe
from common.spark import session
from common.storage import location

from audit.diff import (check_version, history, operations_table,
                        parse_version, snapshot, version_range)
from audit.tables import TableError, outputs as query_outputs, resolve, stream_readers, writers


def job_command(query: str) -> str:
    """The make target that (re)starts a streaming query."""
    if query == "bronze_kafka":
        return "make run-bronze SOURCE=kafka"
    return f"make run-{query.split('_')[0]}"


def _tables_with_paths(cfg, names) -> str:
    return ", ".join(f"{n} ({resolve(cfg, n, must_exist=False)})" for n in names)


def stream_warnings(cfg, name: str, files_removed: int, files_readded: int) -> list[str]:
    """What restoring `name` does to the streams around it, and how to recover each.

    files_removed / files_readded: data files the RESTORE commit removes / adds back. A Delta
    stream source fails on a commit that removes files, but takes one that only adds files as
    new input, so the two cases need different advice."""
    out = []
    STREAM_READERS, WRITERS, OUTPUTS = stream_readers(cfg), writers(cfg), query_outputs(cfg)
    for q in STREAM_READERS.get(name, ()):
        outputs = OUTPUTS.get(q, ())
        head = f"{q} reads {name} as a stream (and writes {', '.join(outputs)})."
        ck = cfg.checkpoint(q)
        if not location(ck).exists():
            out.append(f"{head} It has not run yet, so its first run reads the restored table.")
        elif not (files_removed or files_readded):
            out.append(f"{head} The RESTORE commit changes no data files, so it is unaffected.")
        else:
            effect = (f"The RESTORE commit removes {files_removed} data file(s), a non-append change "
                      f"its Delta source rejects: it will stop on its next run." if files_removed else
                      f"The RESTORE commit only adds back {files_readded} data file(s): it will read "
                      f"their rows again as new input on its next run.")
            out.append(f"{head} {effect} To rebuild from the restored table: delete its checkpoint {ck} "
                       f"and {_tables_with_paths(cfg, outputs)}, then rerun `{job_command(q)}`. Or, to "
                       f"go on without reprocessing, restart it with the Delta source option "
                       f"skipChangeCommits=true (the jobs do not set it).")
    for q in WRITERS.get(name, ()):
        ck = cfg.checkpoint(q)
        if not location(ck).exists():
            out.append(f"{q} writes {name} as a stream (`{job_command(q)}`).")
            continue
        outputs = OUTPUTS.get(q, (name,))
        if q == "gold":
            # Gold folds each batch into its rows: it refuses to build on a table changed by hand.
            out.append(f"{q} writes {name} as a stream, folding each batch into the rows; its checkpoint "
                       f"{ck} is past the restored version, and it will refuse to start on a restored table. "
                       f"To rebuild gold from silver while the pipeline runs: `lakehouse refresh gold` "
                       f"(make refresh TABLE=gold).")
            continue
        out.append(f"{q} writes {name} as a stream; its checkpoint {ck} (offsets and state) is past "
                   f"the restored version, so it will not rewrite the rows the restore rolls back. To rebuild: "
                   f"delete {ck} and {_tables_with_paths(cfg, outputs)}, then rerun `{job_command(q)}`.")
        downstream = sorted({r for t in outputs for r in STREAM_READERS.get(t, ())})
        if downstream:
            out.append(f"Rebuilding {', '.join(t for t in outputs if t in STREAM_READERS)} also "
                       f"invalidates its readers ({', '.join(downstream)}): reset them the same way.")
    return out


def plan(spark, cfg, name: str, path: str, target: int, versions: tuple[int, int] | None = None) -> dict:
    """Everything restore would change, without changing anything."""
    versions = versions or version_range(spark, path)
    check_version(name, target, versions)
    current = versions[1]
    now, then = snapshot(spark, path, current), snapshot(spark, path, target)
    now_files, then_files = set(now.inputFiles()), set(then.inputFiles())
    removed, readded = len(now_files - then_files), len(then_files - now_files)
    return {"table": name, "path": path, "current": current, "target": target,
            "rows_now": now.count(), "rows_target": then.count(),
            "files_removed": removed, "files_readded": readded,
            "undone": history(spark, path, after=target, upto=current),
            "warnings": stream_warnings(cfg, name, removed, readded)}


def plan_text(p: dict) -> str:
    lines = [f"{p['table']} ({p['path']})",
             f"  current version {p['current']}: {p['rows_now']} rows",
             f"  target version  {p['target']}: {p['rows_target']} rows",
             f"  the RESTORE commit removes {p['files_removed']} data file(s) "
             f"and adds back {p['files_readded']}"]
    if p["undone"]:
        lines += [f"commits rolled back ({p['target'] + 1}..{p['current']}):", operations_table(p["undone"])]
    lines.append("streams (stop the jobs that read or write the table before restoring):")

    def wrap(s):
        # Keep `make run-gold` on one line so it can be copied.
        s = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\x00"), s)
        return textwrap.fill(s, 100, initial_indent="  - ", subsequent_indent="    ",
                             break_long_words=False, break_on_hyphens=False).replace("\x00", " ")

    lines += [wrap(w) for w in p["warnings"]] or ["  - no streaming query reads or writes this table"]
    return "\n".join(lines)


def restore(spark, path: str, target: int) -> dict:
    """Restore and report the new version, its row count and Delta's restore metrics."""
    from delta.tables import DeltaTable

    metrics = DeltaTable.forPath(spark, path).restoreToVersion(target).first()
    return {"version": version_range(spark, path)[1],
            "rows": spark.read.format("delta").load(path).count(),
            "metrics": metrics.asDict() if metrics else {}}


def confirm(question: str, stdin) -> bool:
    print(question, end="", flush=True)
    try:
        answer = stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if not answer.endswith("\n"):
        print()  # Ctrl-C / Ctrl-D: end the prompt line so the next message starts clean
    return answer.strip().lower() in ("y", "yes")


@command
def main(argv=None, *, spark=None, cfg=None, stdin=None, prog: str = "audit.restore") -> int:
    """Exit code: 0 restored (or nothing to do), 1 not confirmed, 2 bad input.
    `spark`/`cfg`/`stdin` let tests reuse theirs (the session is then not stopped here)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", metavar="TABLE", help="lakehouse table, e.g. gold.zip_hourly_sightings")
    parser.add_argument("version", metavar="VERSION", help="Delta version to restore")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    args = parser.parse_args(argv)
    stdin = stdin or sys.stdin
    target = parse_version(args.version, "VERSION")
    cfg = cfg or load_config()
    path = resolve(cfg, args.table)
    from pyspark.errors import PySparkException

    with session(cfg, "audit-restore", spark) as spark:
        try:
            versions = version_range(spark, path)
            check_version(args.table, target, versions)
            if versions[1] == target:
                print(f"{args.table} is already at version {target}: nothing to restore")
                return 0
            p = plan(spark, cfg, args.table, path, target, versions)
            print(plan_text(p))
            if not args.yes:
                # A prompt nobody can answer would hang a script or CI job.
                if not stdin.isatty():
                    raise JobError("stdin is not a terminal, so the restore cannot be confirmed; "
                                   "rerun with --yes (make restore ... YES=1) to restore without asking")
                if not confirm(f"Restore {args.table} to version {target}? [y/N] ", stdin):
                    print("aborted: nothing changed")
                    return 1
            done = restore(spark, path, target)
            print(f"restored {args.table} to version {target}: new version {done['version']} (RESTORE), "
                  f"{done['rows']} rows")
        except PySparkException as e:
            raise TableError(f"{args.table}: {describe(e)}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
