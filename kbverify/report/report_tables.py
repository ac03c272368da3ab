"""The report's tables as rows of text cells, and the notes beside them: what the Markdown (`kbverify.report.write`)
and the HTML (`kbverify.report.report_html`) both show, so the two say the same. Evidence is cut at a word boundary.
"""

from __future__ import annotations

import statistics
from collections import Counter

from kbverify.core.present import pct, shorten
from kbverify.report.plots import CLAIMED
from kbverify.report.summary import level_name


def _ci(interval) -> str:
    return "" if not interval else f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def times(value: float | None) -> str:
    if value is None:
        return "–"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f}×"


def _bytes(value: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def fast_p_header(summary: dict) -> tuple[list[str], list[list[str]]]:
    """The side-by-side fast_p table: one row per p, claimed then each protocol's fast_p and confident fast_p."""
    protocols = summary["protocols"]
    has_claims = summary["claimed"]["n"] > 0
    header = ["p"] + ([CLAIMED] if has_claims else [])
    for name in protocols:
        header += [f"{name} fast_p [95% CI]", f"{name} confident"]
    rows = []
    for index, p in enumerate(summary["p_values"]):
        row = [f"{p:g}"]
        if has_claims:
            first = summary["by_protocol"][protocols[0]]["fast_p"][index] if protocols else {}
            row.append(pct(first.get("claimed_fast_p")))
        for name in protocols:
            cell = summary["by_protocol"][name]["fast_p"][index]
            row += [pct(cell["fast_p"]) + _ci(cell.get("fast_p_ci")), pct(cell["confident_fast_p"])]
        rows.append(row)
    return header, rows


def overview_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["protocol", "samples", "tasks", "passed", "geomean (passed)", "mean, failures as 1×", "mean claimed"]
    rows = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        passed = f"{s['passed']} ({pct(s['passed'] / s['n_tasks'])})" if s["n_tasks"] else "0"
        rows.append([name, s["samples"], str(s["n_tasks"]), passed, times(s["geomean_speedup_passed"]),
                     times(s["mean_speedup_failures_as_1"]), f"{times(s['mean_claimed'])} (n={s['n_claimed']})"])
    return header, rows


def level_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["protocol", "level", "tasks", "passed", "fast_0", "fast_1", "fast_2", "geomean (passed)",
              "mean claimed"]
    rows = []
    for name in summary["protocols"]:
        for level, s in summary["by_protocol"][name]["per_level"].items():
            rows.append([name, level, str(s["n_tasks"]), str(s["passed"]), pct(s["fast_p"]["0.0"]),
                         pct(s["fast_p"]["1.0"]), pct(s["fast_p"]["2.0"]), times(s["geomean_speedup_passed"]),
                         times(s["mean_claimed"])])
    return header, rows


def change_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["level", "task", "submission", "change", "protocols", "claimed", "evidence"]
    rows = []
    for c in summary["status_changes"]:
        evidence = c["evidence"]
        where = f"{evidence['protocol']} · set {evidence['set_id']}: " if evidence["set_id"] else \
            f"{evidence['protocol']}: "
        rows.append([level_name(c["level"]), c["task_name"], c["submission"], c["change"],
                     f"{c['from_protocol']} → {c['to_protocol']}", times(c["claimed_speedup"]),
                     where + one_line(evidence["detail"])])
    return header, rows


def transition_counts(summary: dict) -> list[tuple[str, int]]:
    counts = Counter(f"{c['from_protocol']} → {c['to_protocol']}: {c['change']}" for c in summary["status_changes"])
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def code_path_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["task", "submission", "protocol", "status", "measured", "claimed", "what ran"]
    rows = [[r["task_name"], r["submission"], r["protocol"], r["status"], times(r["speedup"]),
             times(r["claimed_speedup"]), "; ".join(r["reasons"])] for r in summary["code_path"]]
    return header, rows


def _memory_per_kernel(summary: dict) -> list[dict]:
    """One row per kernel: the protocol run that saw the largest ratio (each protocol measures its own peak)."""
    kept: dict[tuple, dict] = {}
    for row in summary["memory"]:  # already sorted, largest ratio first
        kept.setdefault((row["task"], row["submission"]), row)
    return list(kept.values())


def memory_rows_text(summary: dict, limit: int) -> tuple[list[str], list[list[str]]]:
    header = ["task", "submission", "protocol", "kernel peak", "reference peak", "ratio"]
    rows = [[r["task_name"], r["submission"], r["protocol"], _bytes(r["peak_memory_bytes"]),
             _bytes(r["ref_peak_memory_bytes"]), "–" if r["ratio"] is None else f"{r['ratio']:.2f}×"]
            for r in _memory_per_kernel(summary)[:limit]]
    return header, rows


def one_line(text: str, limit: int = 160) -> str:
    return shorten(text, limit)


def speed_cell(row: dict) -> str:
    """'0.648× [0.412, 1.019] ambiguous', as `kbverify check` prints a speedup."""
    if row["speedup"] is None:
        return "–"
    text = _x3(row["speedup"])
    if row["speedup_ci"]:
        text += f" [{_x3(row['speedup_ci'][0], unit='')}, {_x3(row['speedup_ci'][1], unit='')}]"
    return text + (f" {row['speed']}" if row["speed"] else "")


def _x3(value: float, unit: str = "×") -> str:
    digits = 3 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f}{unit}"


def _submission_label(row: dict) -> str:
    """The submission's id, with its sample number where the id does not already carry it (`.../s1`)."""
    submission, sample = str(row["submission"]), row["sample"]
    return submission if not sample or submission.endswith(f"s{sample}") else f"{submission} (sample {sample})"


def _evidence_text(evidence: dict) -> str:
    detail = evidence.get("detail") or ""
    return f"set {evidence['set_id']}: {detail}" if evidence.get("set_id") else detail


def verdict_rows(summary: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """The every-verdict table: header, rows of text, and each row's whole evidence (the last cell, shortened)."""
    header = ["level", "task", "submission", "protocol", "status", "speedup [95% CI]", "claimed", "warnings",
              "evidence"]
    rows, evidence = [], []
    for row in summary["verdict_table"]:
        whole = _evidence_text(row["evidence"])
        cells = [level_name(row["level"]), row["task_name"], _submission_label(row), row["protocol"], row["status"],
                 speed_cell(row), times(row["claimed_speedup"]), ", ".join(row["warnings"]),
                 one_line(whole, EVIDENCE_CHARS)]
        rows.append(cells)
        evidence.append(whole)
    return header, rows, evidence


EVIDENCE_CHARS = 160
VERDICTS_NOTE = ("speedup: the PyTorch reference's time over the kernel's (above 1× is faster), with its 95% "
                  "interval; faster, slower, same or ambiguous says where that interval lies against the noise "
                  "margin (ambiguous: it straddles it). KernelBench's own timing (original) gives no interval.")


def provenance_items(summary: dict) -> list[tuple[str, str]]:
    short = summary["provenance_short"]
    items = [("machine", short["machine"] + (" (MIXED: verdicts from several machines)"
                                             if short["mixed_machines"] else "")),
             ("software", ", ".join(short["software"]))]
    if short["isolation"]:
        items.append(("isolation", ", ".join(map(str, short["isolation"]))))
    items += [("run", line) for line in short["runs"]]
    if short["protocols"]:
        items.append(("protocols", ", ".join(f"{name} {' / '.join(hashes) or '–'}"
                                             for name, hashes in short["protocols"].items())))
    return items


PROVENANCE_NOTE = ("The full record (every verdict's provenance, each run's arguments and planned units) is in "
                    "report.json.")


def degraded(summary: dict) -> bool:
    return any(str(value) == "degraded" for value in summary["provenance_short"]["isolation"])


DEGRADED = ("isolation: degraded. This machine allowed no sandbox, so the candidates' processes could reach "
             "what the verdicts depend on; treat these verdicts as unhardened.")



def memory_summary_line(summary: dict) -> str:
    ratios = [r["ratio"] for r in _memory_per_kernel(summary) if r["ratio"] is not None]
    if not ratios:
        return "No reference peak recorded."
    above = sum(r > 2 for r in ratios)
    return (f"{len(ratios)} kernels measured; median ratio {statistics.median(ratios):.2f}×; "
            f"{above} use more than twice the reference's peak (per kernel, the protocol run with the largest ratio).")
