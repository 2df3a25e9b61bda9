"""The audit report as text: a table per lakehouse table, accounting, a verdict line last."""
from __future__ import annotations

from tools.text_table import aligned


def _fmt(n) -> str:
    return "" if n is None else f"{n:,}"


def _prefix_cell(check: dict | None) -> str:
    if check is None:
        return ""
    if check["status"] == "PASS":
        return f"PASS ({check['actual_rows']:,} rows)"
    if check["status"] == "FAIL":
        return f"FAIL (-{check['missing']:,} +{check['unexpected']:,})"
    return "vacuumed, not provable" if check["status"] == "VACUUMED" else "SKIP"


def render(report: dict) -> str:
    out = []
    for t in report["tables"]:
        prefix = {c["version"]: c for c in t.get("prefix", [])}
        headers = ["version", "time (UTC)", "operation", "+rows", "-rows", "made by", "upstream"]
        if prefix:
            headers.append("prefix integrity")
        rows = []
        for v in t["history"]:
            up = v["upstream"]
            cells = [str(v["version"]), v["timestamp"][:19], v["operation"], _fmt(v["rows_added"]),
                     _fmt(v["rows_removed"]), v["made_by"] or "",
                     "" if not up else f"{up['table']}@{'partial' if up['version'] is None else up['version']}"]
            if prefix:
                cells.append(_prefix_cell(prefix.get(v["version"])))
            rows.append(cells)
        summary = t.get("prefix_summary")
        title = t["table"] + (f"  (prefix integrity: {summary['PASS']} PASS, {summary['FAIL']} FAIL, "
                              f"{summary['SKIP']} SKIP" + (f", {summary['VACUUMED']} vacuumed, not provable"
                                                           if summary.get("VACUUMED") else "") + ")"
                              if summary else "")
        out += [title] + aligned(headers, rows, indent="  ", rule=True)
        a = t.get("attribution")
        if a:
            out.append(f"  {a['table']} attribution: {a['status']} ({a['rows_checked']:,} rows joined again at their "
                       f"event time with the dimension version their batch pinned ({', '.join(map(str, a['dimension_versions']))}), "
                       f"{a['rows_differ']:,} differ" + (f"; {a['rows_unpinned']:,} rows of batches without a pin, "
                                                          "not checked" if a["rows_unpinned"] else "") + ")")
            for row in a["sample"]:
                out.append(f"    differs: {_row(row)}")
        if t.get("log_cleaned_before"):
            out.append(f"  versions before {t['log_cleaned_before']}: log cleaned (older than "
                       "maintenance.log_retention), not listed")
        for c in t.get("prefix", []):
            if c["status"] == "FAIL":
                out.append(f"  version {c['version']} ({c['operation']}, {c['made_by'] or 'table creation'}) "
                           f"differs from the recompute over silver@{c['upstream']}: "
                           f"{c['expected_rows']:,} rows expected, {c['actual_rows']:,} in the table")
                for label, sample in (("missing from the table", c["missing_sample"]),
                                      ("not produced by the pipeline", c["unexpected_sample"])):
                    for row in sample:
                        out.append(f"    {label}: {_row(row)}")
            elif c["status"] == "SKIP" and c["note"]:
                out.append(f"  version {c['version']}: SKIP, {c['note']}")
        out.append("")
    if report["accounting"]:
        out.append("accounting")
        width = max(len(a["name"]) for a in report["accounting"])
        for a in report["accounting"]:
            body = a["equation"] if a["left"] else a["note"]
            note = f"  ({a['note']})" if a["left"] and a["note"] else ""
            out.append(f"  {a['name'].ljust(width)}  {a['status']}  {body}{note}")
        out.append("")
    versions = sum(1 for t in report["tables"] for c in t.get("prefix", []) if c["status"] in ("PASS", "FAIL"))
    old = sum(1 for t in report["tables"] for c in t.get("prefix", []) if c["status"] == "VACUUMED")
    horizon = report.get("horizon")
    if horizon:
        out.append(f"audit horizon: {horizon['audit_horizon']} (versions since {horizon['cutoff']} are "
                   f"provable; {old} older gold version(s) vacuumed, not provable)")
    if report["ok"]:
        out.append(f"audit: PASS - {len(report['tables'])} tables, {versions} gold versions recomputed, "
                   f"{len(report['accounting'])} accounting checks ({report['seconds']} s)")
    else:
        out.append(f"audit: FAIL - {len(report['failures'])} failed check(s):")
        out += [f"  {f}" for f in report["failures"]]
    return "\n".join(out)


def _row(row: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items())
