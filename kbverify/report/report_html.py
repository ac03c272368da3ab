"""The self-contained HTML report: its CSS and SVG plots (`kbverify.report.plots`) inline, with no script and no external
resource, so it can be attached to an issue or archived as is. It renders the tables the Markdown renders
(`kbverify.report.report_tables`); evidence is cut at a word boundary there, and here the whole text is one click away.
The page is `templates/report.html.j2`, rendered with autoescape: this module hands it text and the kind of each
cell, never markup, so a submission named `<script>…</script>.py` shows as text (`tests/test_report.py`).
"""

from __future__ import annotations

from kbverify.core.present import shorten
from kbverify.report.leaderboard import render_html as leaderboard_html
from kbverify.report.plots import protocol_colours, svg_claimed_vs_measured, svg_fast_p_curves
from kbverify.report.report_tables import (DEGRADED, EVIDENCE_CHARS, PROVENANCE_NOTE, VERDICTS_NOTE, change_rows,
                                    code_path_rows, degraded, fast_p_header, level_rows, memory_rows_text,
                                    memory_summary_line, one_line, overview_rows, pct, provenance_items, speed_cell,
                                    times, transition_counts, verdict_rows)
from kbverify.core.status import Status
from kbverify.report.templates import render, safe


def _status(value: str) -> dict:
    """A status cell, shown as passing or failing."""
    return {"kind": "status", "value": value, "passed": value == Status.PASSED.value}


def _table(header: list[str], rows: list[list], *, numeric=frozenset(), nowrap=frozenset(),
           table_id: str | None = None) -> dict:
    return {"header": header, "rows": rows, "numeric": set(numeric), "nowrap": set(nowrap), "id": table_id}


def _speed(row: dict) -> dict:
    """The speedup and its interval on one line, the speed class below it."""
    text = None if row["speedup"] is None else speed_cell({**row, "speed": None})
    return {"kind": "speed", "text": text, "speed": row["speed"]}


def _details(text: str, limit: int = EVIDENCE_CHARS) -> dict:
    """Short text as it is; longer text cut at a word boundary, the whole of it one click away."""
    text = " ".join(str(text).split())
    return {"kind": "details", "text": text, "short": shorten(text, limit) if len(text) > limit else None}


def render_html(summary: dict, *, memory_limit: int = 100) -> str:
    colours = protocol_colours(summary["protocols"])
    figures = [(safe(svg_fast_p_curves(summary, colours)),
                "fast_p as a function of p, every protocol (solid) and the published claims (dashed)."),
               (safe(svg_claimed_vs_measured(summary, colours)),
                "Claimed against measured speedup (log–log), one point per verdict. Filled: passed; hollow: failed "
                "but timed; × on the bottom strip: failed, not timed. Dashed: measured = claimed.")]
    alerts = [DEGRADED] if degraded(summary) else []
    alerts += [summary["foreign_gpu"]] if summary.get("foreign_gpu") else []
    fast_p, overview, levels = fast_p_header(summary), overview_rows(summary), level_rows(summary)
    return render(
        "report.html.j2", title=summary["title"], n_verdicts=len(summary["verdicts"]),
        protocols=", ".join(summary["protocols"]) or "none", version=summary["kbverify_version"], alerts=alerts,
        cards=_cards(summary), figures=figures,
        fast_p=_table(*fast_p, numeric=range(1, len(fast_p[0]))),
        overview=_table(*overview, numeric=range(2, len(overview[0]))),
        levels=_table(*levels, numeric=range(2, len(levels[0]))),
        leaderboard=safe(leaderboard_html(summary["leaderboard"])) if summary.get("leaderboard") else None,
        changes=_changes(summary), verdicts_note=VERDICTS_NOTE, verdicts=_verdicts(summary),
        code_path=_table(*code_path_rows(summary), numeric={4, 5}) if summary["code_path"] else None,
        memory=_memory(summary, memory_limit), unverifiable=_unverifiable(summary),
        provenance=provenance_items(summary), provenance_note=PROVENANCE_NOTE)


def _changes(summary: dict) -> dict | None:
    if not summary["status_changes"]:
        return None
    header, rows = change_rows(summary)
    change_column, evidence_column = header.index("change"), header.index("evidence")
    for row, change in zip(rows, summary["status_changes"]):
        row[change_column] = {"kind": "change", "before": _status(change["from_status"]),
                              "after": _status(change["to_status"])}
        evidence = change["evidence"]
        where = f"{evidence['protocol']} · set {evidence['set_id']}: " if evidence["set_id"] else \
            f"{evidence['protocol']}: "
        row[evidence_column] = _details(where + " ".join(str(evidence["detail"]).split()))
    return {"counts": transition_counts(summary), "table": _table(header, rows, nowrap={3, 4}, numeric={5})}


def _verdicts(summary: dict) -> dict:
    header, rows, evidence = verdict_rows(summary)
    status_column = header.index("status")
    speed_column = header.index("speedup [95% CI]")
    for row, whole, data in zip(rows, evidence, summary["verdict_table"]):
        row[status_column] = _status(row[status_column])
        row[speed_column] = _speed(data)
        row[1] = {"kind": "breakable", "text": row[1]}  # long task names break after an underscore, not mid-word
        row[-1] = _details(whole)
    return _table(header, rows, numeric={header.index("claimed")}, nowrap={status_column}, table_id="verdict-table")


def _memory(summary: dict, limit: int) -> dict | None:
    if not summary["memory"]:
        return None
    header, rows = memory_rows_text(summary, limit)
    more = _table(header, rows[10:], numeric={3, 4, 5}) if rows[10:] else None
    return {"line": memory_summary_line(summary), "first": _table(header, rows[:10], numeric={3, 4, 5}),
            "more": more}


def _unverifiable(summary: dict) -> dict | None:
    unverifiable = summary["unverifiable"]
    if not unverifiable["n"]:
        return None
    rows = [[r["task_name"], r["submission"], times(r["claimed_speedup"]), one_line(r["why"])]
            for r in unverifiable["items"]]
    return {"n": unverifiable["n"], "n_with_claim": unverifiable["n_with_claim"],
            "mean": times(unverifiable["mean_claimed"]),
            "table": _table(["task", "submission", "claimed", "why"], rows, numeric={2})}


def _cards(summary: dict) -> list[tuple[str, str]]:
    cards = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        fast1 = next(r["fast_p"] for r in s["fast_p"] if r["p"] == 1.0) if s["fast_p"] else None
        cards.append((f"{pct(fast1)}", f"fast_1 · {name}"))
    if summary["claimed"]["n"]:
        cards.append((times(summary["claimed"]["mean"]), f"mean claimed speedup (n={summary['claimed']['n']})"))
    cards.append((str(len(summary["status_changes"])), "status changes"))
    cards.append((str(summary["unverifiable"]["n"]), "unverifiable claims"))
    return cards
