"""Reports from verdicts: `report.json` (complete), `report.md` (papers, PRs), `report.html` (self-contained).

Everything is computed once into a plain summary (`kbverify.report.summary.summarize`), which the JSON stores and the
Markdown (here) and the HTML (`kbverify.report.report_html`) render from the same tables (`kbverify.report.report_tables`).
The Markdown and the HTML show a table of every verdict and provenance as a short block (machine, software, run
ids); the full provenance record, with each run's arguments, is in the JSON alone.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Sequence

from kbverify.core.records import Verdict
from kbverify.report.leaderboard import render_markdown as leaderboard_markdown
from kbverify.report.plots import CLAIMED
from kbverify.report.report_html import render_html
from kbverify.report.report_tables import (DEGRADED, PROVENANCE_NOTE, VERDICTS_NOTE, change_rows, code_path_rows, degraded,
                                    fast_p_header, level_rows, memory_rows_text, memory_summary_line, overview_rows,
                                    pct, provenance_items, times, transition_counts, verdict_rows)
from kbverify.report.summary import P_VALUES, summarize


# --- writing ----------------------------------------------------------------------------------------------------

def write_reports(verdicts: Sequence[Verdict], out_dir: str | Path, *, title: str = "kbverify report",
                  provenance: dict | None = None, samples: str | None = None,
                  group_by: str | None = None) -> dict[str, Path]:
    """Write report.json, report.md and report.html into `out_dir`; returns their paths by format.

    `samples` and `group_by` as in `summarize`. Nothing is written unless the whole summary could be computed.
    """
    out_dir = Path(out_dir)
    summary = summarize(verdicts, title=title, provenance=provenance, samples=samples, group_by=group_by)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        "json": json.dumps(_json_safe(summary), indent=1, allow_nan=False) + "\n",
        "md": render_markdown(summary),
        "html": render_html(summary),
    }
    paths = {}
    for fmt, text in texts.items():
        paths[fmt] = out_dir / f"report.{fmt}"
        _write_atomically(paths[fmt], text)
    return paths


def _write_atomically(path: Path, text: str) -> None:
    """A reader never sees half a report: write beside it, then rename over it."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# --- Markdown ---------------------------------------------------------------------------------------------------

def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(summary: dict, *, memory_limit: int = 20) -> str:
    out = [f"# {summary['title']}", ""]
    if degraded(summary):
        out += [f"**{DEGRADED}**", ""]
    if summary.get("foreign_gpu"):
        out += [f"**{summary['foreign_gpu']}**", ""]
    n_claims, unverifiable = summary["claimed"]["n"], summary["unverifiable"]
    out += [f"{len(summary['verdicts'])} verdicts under {', '.join(summary['protocols']) or 'no protocol'}; "
            f"{n_claims} claimed speedups (mean {times(summary['claimed']['mean'])}); "
            f"{unverifiable['n']} claims cannot be verified (no code or no task).", ""]
    out += ["## fast_p", "", "Share of all tasks that are correct and faster than p× (failures and unverifiable "
            "claims stay in the denominator); *confident*: the lower 95% bound of the speedup is above p. Under "
            "protocols with a clean reference that bound includes what a rerun redraws (each model copy's own "
            "offset), not only the run's own noise.", ""]
    out += [_md_table(*fast_p_header(summary)), "", _md_table(*overview_rows(summary)), ""]
    out += ["## Per level", "", _md_table(*level_rows(summary)), ""]
    if summary.get("leaderboard"):
        out += [leaderboard_markdown(summary["leaderboard"])]
    out += ["## Status changes between protocols", ""]
    if summary["status_changes"]:
        out += [f"- {label}: {count}" for label, count in transition_counts(summary)]
        out += ["", _md_table(*change_rows(summary)), ""]
    else:
        out += ["None.", ""]
    header, rows, _ = verdict_rows(summary)
    out += ["## Every verdict", "", VERDICTS_NOTE + " Evidence is shortened here; report.json has it whole.", "",
            _md_table(header, rows), ""]
    out += ["## Measured code path differs from the claimed one", ""]
    out += [_md_table(*code_path_rows(summary)) if summary["code_path"] else "None found.", ""]
    if summary["memory"]:
        out += ["## Peak GPU memory against the reference", "", memory_summary_line(summary), "",
                _md_table(*memory_rows_text(summary, memory_limit)), ""]
    if unverifiable["n"]:
        out += ["## Unverifiable claims", "",
                f"{unverifiable['n']} entries cannot be verified; {unverifiable['n_with_claim']} of them carry a "
                f"claimed speedup (mean {times(unverifiable['mean_claimed'])}).", ""]
    out += ["## Provenance", ""] + [f"- **{key}**: {value}" for key, value in provenance_items(summary)]
    out += ["", PROVENANCE_NOTE, ""]
    return "\n".join(out)


def render_markdown_summary(verdicts: Sequence[Verdict]) -> str:
    """A short table for the terminal: per protocol, tasks, passed, fast_p and the geometric-mean speedup."""
    summary = summarize(verdicts)
    header = ["protocol", "tasks", "passed"] + [f"fast_{p:g}" for p in P_VALUES] + ["geomean (passed)"]
    rows = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        rows.append([name, str(s["n_tasks"]), str(s["passed"])] + [pct(r["fast_p"]) for r in s["fast_p"]]
                    + [times(s["geomean_speedup_passed"])])
    if summary["claimed"]["n"] and summary["protocols"]:
        first = summary["by_protocol"][summary["protocols"][0]]
        rows.append([CLAIMED, str(first["n_tasks"]), "–"] + [pct(r["claimed_fast_p"]) for r in first["fast_p"]]
                    + ["–"])
    lines = [_md_table(header, rows)]
    if summary["status_changes"]:
        lines.append(f"{len(summary['status_changes'])} status changes between protocols.")
    if summary["unverifiable"]["n"]:
        lines.append(f"{summary['unverifiable']['n']} claims cannot be verified.")
    return "\n".join(lines) + "\n"
