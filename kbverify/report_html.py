"""The self-contained HTML report: its CSS and SVG plots (`kbverify.plots`) inline, with no script and no external
resource, so it can be attached to an issue or archived as is. It renders the tables the Markdown renders
(`kbverify.report_tables`); evidence is cut at a word boundary there, and here the whole text is one click away.
"""

from __future__ import annotations

import html

from kbverify.leaderboard import render_html as leaderboard_html
from kbverify.plots import protocol_colours, svg_claimed_vs_measured, svg_fast_p_curves
from kbverify.present import shorten
from kbverify.report_tables import (DEGRADED, EVIDENCE_CHARS, PROVENANCE_NOTE, VERDICTS_NOTE, change_rows,
                                    code_path_rows, degraded, fast_p_header, level_rows, memory_rows_text,
                                    memory_summary_line, one_line, overview_rows, pct, provenance_items, speed_cell,
                                    times, transition_counts, verdict_rows)
from kbverify.status import Status

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2733;margin:0;background:#f4f6f8}
main{max-width:1240px;margin:0 auto;padding:24px 32px 48px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #dde3e9;padding-bottom:4px}
p.lead{color:#4a5866;margin:4px 0 16px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px;width:auto}
th,td{padding:4px 10px;border-bottom:1px solid #e6eaee;text-align:left;vertical-align:top}
th{background:#f0f3f6;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr:hover td{background:#fafbfc}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #dde3e9;border-radius:6px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:20px}.card span{color:#5b6875;font-size:12px}
.plots{display:flex;gap:16px;flex-wrap:wrap}
figure{margin:0;border:1px solid #dde3e9;border-radius:6px;padding:8px}
figcaption{font-size:12px;color:#5b6875;max-width:520px}
.status-passed{color:#1e7e34}.status-fail{color:#b02a37;font-weight:600}
code,pre{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
pre{background:#f6f8fa;padding:10px;overflow:auto;border-radius:4px}
details summary{cursor:pointer;color:#1b6ca8}details p{margin:4px 0 0;overflow-wrap:anywhere}
details[open] summary{color:#5b6875}
.alert{background:#fdecea;border:1px solid #b02a37;color:#7a1420;padding:8px 12px;border-radius:6px;font-weight:600}
dl.provenance{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:8px 0}
dl.provenance dt{font-weight:600;color:#4a5866}dl.provenance dd{margin:0;overflow-wrap:anywhere}
#verdict-table{font-size:12px;width:100%}#verdict-table td{padding:3px 6px}
#verdict-table td:nth-child(2){min-width:120px}#verdict-table td:last-child{min-width:220px}
.muted{color:#5b6875}
td.nowrap,td.num,span.nowrap{white-space:nowrap}
"""


def _h(text) -> str:
    return html.escape(str(text), quote=True)


def _html_table(header: list[str], rows: list[list[str]], *, numeric: set[int] = frozenset(),
                raw: set[int] = frozenset(), nowrap: set[int] = frozenset(), table_id: str | None = None) -> str:
    def cell(tag: str, index: int, text: str) -> str:
        classes = " ".join(name for name, cols in (("num", numeric), ("nowrap", nowrap)) if index in cols)
        cls = f' class="{classes}"' if classes else ""
        return f"<{tag}{cls}>{text if index in raw else _h(text)}</{tag}>"
    head = "".join(cell("th", i, t) for i, t in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, t) for i, t in enumerate(row)) + "</tr>" for row in rows)
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _speed_html(row: dict) -> str:
    """The speedup and its interval on one line, the speed class below it."""
    if row["speedup"] is None:
        return "–"
    text = speed_cell({**row, "speed": None})
    speed = f'<br><span class="muted">{_h(row["speed"])}</span>' if row["speed"] else ""
    return f'<span class="nowrap">{_h(text)}</span>{speed}'


def _details_html(text: str, limit: int = EVIDENCE_CHARS) -> str:
    """Short text as it is; longer text cut at a word boundary, the whole of it one click away."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return _h(text)
    return f"<details><summary>{_h(shorten(text, limit))}</summary><p>{_h(text)}</p></details>"


def _status_html(status: str) -> str:
    cls = "status-passed" if status == Status.PASSED.value else "status-fail"
    return f'<span class="{cls}">{_h(status)}</span>'


def render_html(summary: dict, *, memory_limit: int = 100) -> str:
    sections = (_heading(summary), _fast_p_section(summary), _level_section(summary), _change_section(summary),
                _verdict_section(summary), _code_path_section(summary), _memory_section(summary, memory_limit),
                _unverifiable_section(summary), _provenance_section(summary))
    body = "\n".join(part for section in sections for part in section)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_h(summary['title'])}</title><style>{_CSS}</style></head>\n<body><main>\n{body}\n"
            f"</main></body></html>\n")


# Each section is a list of HTML fragments; the page puts one per line.

def _heading(summary: dict) -> list[str]:
    return [f"<h1>{_h(summary['title'])}</h1>",
            f'<p class="lead">{len(summary["verdicts"])} verdicts · protocols '
            f'{_h(", ".join(summary["protocols"]) or "none")} · kbverify {_h(summary["kbverify_version"])}</p>',
            *([f'<p class="alert">{_h(DEGRADED)}</p>'] if degraded(summary) else []),
            *([f'<p class="alert">{_h(summary["foreign_gpu"])}</p>'] if summary.get("foreign_gpu") else []),
            _cards(summary)]


def _fast_p_section(summary: dict) -> list[str]:
    colours = protocol_colours(summary["protocols"])
    parts = ["<h2>fast_p</h2><p class=\"muted\">Share of all tasks that are correct and faster than p× "
             "(failures and unverifiable claims stay in the denominator); <i>confident</i>: the lower 95% "
             "bound of the kernel's speedup is above p. Bracketed: 95% bootstrap interval over tasks.</p>"]
    header, rows = fast_p_header(summary)
    parts.append(_html_table(header, rows, numeric=set(range(1, len(header)))))
    header, rows = overview_rows(summary)
    parts.append(_html_table(header, rows, numeric=set(range(2, len(header)))))
    parts.append('<div class="plots">' + _figure(svg_fast_p_curves(summary, colours),
                 "fast_p as a function of p, every protocol (solid) and the published claims (dashed).")
                 + _figure(svg_claimed_vs_measured(summary, colours),
                           "Claimed against measured speedup (log–log), one point per verdict. Filled: passed; "
                           "hollow: failed but timed; × on the bottom strip: failed, not timed. Dashed: "
                           "measured = claimed.") + "</div>")
    return parts


def _level_section(summary: dict) -> list[str]:
    header, rows = level_rows(summary)
    parts = ["<h2>Per level</h2>", _html_table(header, rows, numeric=set(range(2, len(header))))]
    if summary.get("leaderboard"):
        parts.append(leaderboard_html(summary["leaderboard"]))
    return parts


def _change_section(summary: dict) -> list[str]:
    parts = ["<h2>Status changes between protocols</h2>"]
    if not summary["status_changes"]:
        return parts + ["<p>None.</p>"]
    counts = "".join(f"<li>{_h(label)}: <b>{count}</b></li>" for label, count in transition_counts(summary))
    parts.append(f"<ul>{counts}</ul>")
    header, rows = change_rows(summary)
    change_column = header.index("change")
    for row, change in zip(rows, summary["status_changes"]):
        row[:] = [_h(cell) for cell in row]
        row[change_column] = f"{_status_html(change['from_status'])} → {_status_html(change['to_status'])}"
    evidence_column = header.index("evidence")
    for row, change in zip(rows, summary["status_changes"]):
        evidence = change["evidence"]
        where = f"{evidence['protocol']} · set {evidence['set_id']}: " if evidence["set_id"] else \
            f"{evidence['protocol']}: "
        row[evidence_column] = _details_html(where + " ".join(str(evidence["detail"]).split()))
    parts.append(_html_table(header, rows, raw=set(range(len(header))), nowrap={3, 4}, numeric={5}))
    return parts


def _verdict_section(summary: dict) -> list[str]:
    header, rows, evidence = verdict_rows(summary)
    status_column = header.index("status")
    speed_column = header.index("speedup [95% CI]")
    for row, whole, data in zip(rows, evidence, summary["verdict_table"]):
        status = row[status_column]
        row[:] = [_h(cell) for cell in row]
        row[status_column] = _status_html(status)
        row[speed_column] = _speed_html(data)
        row[1] = row[1].replace("_", "_<wbr>")  # long task names break after an underscore, not mid-word
        row[-1] = _details_html(whole)
    return [f'<h2 id="verdicts">Every verdict</h2><p class="muted">{_h(VERDICTS_NOTE)}</p>',
            _html_table(header, rows, raw=set(range(len(header))), numeric={header.index("claimed")},
                        nowrap={status_column}, table_id="verdict-table")]


def _code_path_section(summary: dict) -> list[str]:
    return ["<h2>Measured code path differs from the claimed one</h2>",
            _html_table(*code_path_rows(summary), numeric={4, 5}) if summary["code_path"] else "<p>None found.</p>"]


def _memory_section(summary: dict, limit: int) -> list[str]:
    if not summary["memory"]:
        return []
    header, rows = memory_rows_text(summary, limit)
    parts = ["<h2>Peak GPU memory against the reference</h2>", f"<p>{_h(memory_summary_line(summary))}</p>",
             _html_table(header, rows[:10], numeric={3, 4, 5})]
    if rows[10:]:
        parts.append(f"<details><summary>{len(rows) - 10} more</summary>"
                     + _html_table(header, rows[10:], numeric={3, 4, 5}) + "</details>")
    return parts


def _unverifiable_section(summary: dict) -> list[str]:
    unverifiable = summary["unverifiable"]
    if not unverifiable["n"]:
        return []
    rows = [[r["task_name"], r["submission"], times(r["claimed_speedup"]), one_line(r["why"])]
            for r in unverifiable["items"]]
    return ["<h2>Unverifiable claims</h2>",
            f"<p>{unverifiable['n']} entries cannot be verified; {unverifiable['n_with_claim']} carry a "
            f"claimed speedup (mean {_h(times(unverifiable['mean_claimed']))}).</p>",
            "<details><summary>List</summary>"
            + _html_table(["task", "submission", "claimed", "why"], rows, numeric={2}) + "</details>"]


def _provenance_section(summary: dict) -> list[str]:
    items = "".join(f"<dt>{_h(key)}</dt><dd>{_h(value)}</dd>" for key, value in provenance_items(summary))
    return [f'<h2>Provenance</h2><dl class="provenance">{items}</dl><p class="muted">{_h(PROVENANCE_NOTE)}</p>']


def _cards(summary: dict) -> str:
    cards = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        fast1 = next(r["fast_p"] for r in s["fast_p"] if r["p"] == 1.0) if s["fast_p"] else None
        cards.append((f"{pct(fast1)}", f"fast_1 · {name}"))
    if summary["claimed"]["n"]:
        cards.append((times(summary["claimed"]["mean"]), f"mean claimed speedup (n={summary['claimed']['n']})"))
    cards.append((str(len(summary["status_changes"])), "status changes"))
    cards.append((str(summary["unverifiable"]["n"]), "unverifiable claims"))
    return '<div class="cards">' + "".join(f'<div class="card"><b>{_h(v)}</b><span>{_h(k)}</span></div>'
                                           for v, k in cards) + "</div>"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_h(caption)}</figcaption></figure>"
