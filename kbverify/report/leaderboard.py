"""Leaderboards: the score tables split by one label (`--group-by FIELD`, e.g. `model`), groups side by side.

For each group and protocol: tasks, correct, fast_p at every p the tables use and the geomean speedup of the
correct kernels (both from `kbverify.results.score`, the code path every other table takes); for each group, the status
changes between consecutive protocols (`passed → incorrect`: 3). One plain dict (`board_from_verdicts`,
`board_from_rows`) is what the JSON holds and what the text, Markdown and HTML renderers show. An entry without the
field is in the group `NO_VALUE`, so every verdict is counted once.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from kbverify.core.labels import require_field
from kbverify.core.present import pct
from kbverify.core.records import Verdict
from kbverify.report.templates import render
from kbverify.results.counting import samples_rule, score_rows_from_verdicts, status_changes

NO_VALUE = "(none)"


def board_from_verdicts(verdicts: Sequence[Verdict], field: str, ps, *, samples: str | None = None,
                        exclude: set[str] | None = None, what: str = "the store") -> dict:
    """`samples` None takes each protocol's own rule, as the reports do. InputError when no verdict has `field`."""
    require_field(field, [v.labels for v in verdicts], what)
    protocols = list(dict.fromkeys(v.protocol for v in verdicts))
    groups = []
    for value, members in _split(verdicts, lambda v: v.labels.get(field)):
        tables = {name: _table(score_rows_from_verdicts([v for v in members if v.protocol == name]), ps,
                               samples or samples_rule(name), exclude) for name in protocols}
        changes = Counter(f"{c['from_protocol']} → {c['to_protocol']}: {c['change']}"
                          for c in status_changes(members, protocols))
        groups.append({"group": value, "n_verdicts": len(members), "tables": tables,
                       "status_changes": dict(sorted(changes.items())), "n_status_changes": sum(changes.values())})
    return {"field": field, "p_values": list(ps), "protocols": protocols, "groups": groups}


def board_from_rows(rows: Sequence, field: str, ps, *, samples: str, exclude: set[str] | None = None,
                    what: str, name: str = "scores") -> dict:
    """The same board from scored rows (`kbverify.results.score.ScoreRow`, a score JSONL): one table per group, no
    protocols to change status between."""
    require_field(field, [dict(row.labels) for row in rows], what)
    groups = [{"group": value, "n_verdicts": len(members),
               "tables": {name: _table(members, ps, samples, exclude)}, "status_changes": {}, "n_status_changes": 0}
              for value, members in _split(rows, lambda row: dict(row.labels).get(field))]
    return {"field": field, "p_values": list(ps), "protocols": [name], "groups": groups}


def _split(items, value_of) -> list[tuple[str, list]]:
    """(value, members) in order of value, the group without the field last."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(value_of(item) or NO_VALUE, []).append(item)
    return sorted(groups.items(), key=lambda pair: (pair[0] == NO_VALUE, pair[0]))


def _table(rows, ps, samples: str, exclude) -> dict | None:
    from kbverify.results.score import score_rows, table_to_dict

    return table_to_dict(score_rows(rows, ps, samples=samples, exclude=exclude)) if rows else None


# --- rendering -------------------------------------------------------------------------------------------------------

def score_grid(board: dict, protocol: str) -> tuple[list[str], list[list[str]]]:
    """One protocol's groups side by side: header and rows (group, tasks, correct, fast_p per p, geomean)."""
    header = [board["field"], "tasks", "correct"] + [f"fast_{p:g}" for p in board["p_values"]] + ["geomean"]
    rows = []
    for group in board["groups"]:
        table = group["tables"].get(protocol)
        if table is None:
            rows.append([group["group"], "0", "0"] + ["–"] * len(board["p_values"]) + ["–"])
            continue
        by_p = {row["p"]: row for row in table["rows"]}
        cells = [pct(by_p[p]["fast_p"]) if p in by_p else "–" for p in board["p_values"]]
        geomean = table["geomean_speedup"]
        rows.append([group["group"], str(table["n_tasks"]), str(table["n_correct"]), *cells,
                     "–" if geomean is None else f"{geomean:.3f}x"])
    return header, rows


def changes_grid(board: dict) -> tuple[list[str], list[list[str]]] | None:
    """Status changes per group, one column per kind of change; None when no group has any."""
    kinds = sorted({kind for group in board["groups"] for kind in group["status_changes"]})
    if not kinds:
        return None
    header = [board["field"], "changed"] + kinds
    rows = [[group["group"], str(group["n_status_changes"])]
            + [str(group["status_changes"].get(kind, 0)) for kind in kinds] for group in board["groups"]]
    return header, rows


def _sections(board: dict) -> list[tuple[str, tuple[list[str], list[list[str]]]]]:
    samples = {name: next((g["tables"][name]["samples"] for g in board["groups"] if g["tables"].get(name)), "")
               for name in board["protocols"]}
    sections = [(f"{name} by {board['field']} (samples: {samples[name]})", score_grid(board, name))
                for name in board["protocols"]]
    changes = changes_grid(board)
    if changes is not None:
        sections.append((f"status changes between protocols by {board['field']}", changes))
    return sections


def render_text(board: dict) -> str:
    out = []
    for title, (header, rows) in _sections(board):
        widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
        out.append(title)
        for line in [header, *rows]:
            out.append("  " + "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())
    return "\n".join(out) + "\n"


def render_markdown(board: dict) -> str:
    out = [f"## Leaderboard by {board['field']}", ""]
    for title, (header, rows) in _sections(board):
        out += [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        out.append("")
    return "\n".join(out)


def render_html(board: dict) -> str:
    """The board as HTML (`templates/leaderboard.html.j2`, autoescaped: the grouping field's values are the run's)."""
    sections = [(title, header, rows) for title, (header, rows) in _sections(board)]
    return render("leaderboard.html.j2", field=board["field"], sections=sections)
