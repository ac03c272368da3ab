"""Reports from verdicts: `report.json` (complete), `report.md` (papers, PRs), `report.html` (self-contained).

Everything is computed once into a plain summary (`summarize`), which the JSON stores and the Markdown and HTML
render; the HTML carries its CSS and SVG plots inline, with no script and no external resource, so it can be
attached to an issue or archived as is.
"""

from __future__ import annotations

import html
import json
import math
import os
import statistics
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Sequence

from kbverify import __version__
from kbverify.protocols import PRESETS
from kbverify.records import Verdict
from kbverify.status import Status, Warn

P_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0)
CLAIMED = "claimed"
_PALETTE = ("#1b6ca8", "#c0392b", "#2e8b57", "#8e44ad", "#d68910", "#17a2b8")
_CLAIMED_COLOUR = "#7f8c8d"


# --- summary -------------------------------------------------------------------------------------------------------

def summarize(verdicts: Sequence[Verdict], *, title: str = "kbverify report", provenance: dict | None = None) -> dict:
    """Everything the reports show, as JSON-ready data."""
    protocols = list(dict.fromkeys(v.protocol for v in verdicts))
    by_protocol = {name: [v for v in verdicts if v.protocol == name] for name in protocols}
    return {
        "title": title,
        "kbverify_version": __version__,
        "p_values": list(P_VALUES),
        "protocols": protocols,
        "claimed": _claimed_summary(verdicts),
        "by_protocol": {name: _protocol_summary(name, group) for name, group in by_protocol.items()},
        "status_changes": status_changes(verdicts, protocols),
        "code_path": code_path_mismatches(verdicts),
        "memory": memory_rows(verdicts),
        "unverifiable": _unverifiable(verdicts),
        "provenance": _provenance(verdicts, provenance),
        "verdicts": [v.to_dict() for v in verdicts],
    }


def _samples_rule(protocol: str) -> str:
    preset = PRESETS.get(protocol)
    return preset.samples if preset is not None else "first"


def _protocol_summary(name: str, verdicts: list[Verdict]) -> dict:
    samples = _samples_rule(name)
    chosen = _one_per_task(verdicts, samples)
    passed_speedups = [v.speedup for v in chosen if v.correct and _positive(v.speedup)]
    levels = sorted({v.level for v in chosen}, key=lambda level: (level is None, level or 0))
    return {
        "samples": samples,
        "n_verdicts": len(verdicts),
        "n_tasks": len(chosen),
        "status_counts": dict(Counter(v.status.value for v in verdicts).most_common()),
        "warning_counts": dict(Counter(w for v in verdicts for w in v.warnings).most_common()),
        "fast_p": fast_p_table(chosen),
        "curve": _curve(chosen),
        "passed": sum(v.correct for v in chosen),
        "geomean_speedup_passed": _geomean(passed_speedups),
        "mean_speedup_passed": statistics.fmean(passed_speedups) if passed_speedups else None,
        # What a user who falls back to PyTorch on every failure gets: CUDA-L1 reports its mean this way.
        "mean_speedup_failures_as_1": (
            statistics.fmean([v.speedup if v.correct and _positive(v.speedup) else 1.0 for v in chosen])
            if chosen else None),
        "mean_claimed": _mean([v.claimed_speedup for v in chosen]),
        "n_claimed": sum(v.claimed_speedup is not None for v in chosen),
        "per_level": {_level_name(level): _level_summary([v for v in chosen if v.level == level])
                      for level in levels},
    }


def _level_summary(verdicts: list[Verdict]) -> dict:
    passed = [v.speedup for v in verdicts if v.correct and _positive(v.speedup)]
    return {
        "n_tasks": len(verdicts),
        "passed": sum(v.correct for v in verdicts),
        "fast_p": {str(row["p"]): row["fast_p"] for row in fast_p_table(verdicts, confidence_interval=False)},
        "geomean_speedup_passed": _geomean(passed),
        "mean_claimed": _mean([v.claimed_speedup for v in verdicts]),
        "n_claimed": sum(v.claimed_speedup is not None for v in verdicts),
    }


def _one_per_task(verdicts: list[Verdict], samples: str) -> list[Verdict]:
    """One verdict per task: its first sample, or its best (fastest passing) one, as the protocol scores."""
    by_task: dict[str, list[Verdict]] = defaultdict(list)
    for verdict in verdicts:
        by_task[verdict.task].append(verdict)
    chosen = []
    for group in by_task.values():
        if samples == "best":
            chosen.append(max(group, key=lambda v: (v.correct, v.speedup or 0.0, -v.sample)))
        else:
            chosen.append(min(group, key=lambda v: v.sample))
    return chosen


def fast_p_table(verdicts: Sequence[Verdict], ps: Sequence[float] = P_VALUES, *,
                 confidence_interval: bool = True) -> list[dict]:
    """fast_p per p over one verdict per task (failures stay in the denominator), with the claimed fast_p.

    Built on `kbverify.stats` (fast_p, confident_fast_p, bootstrap CI) with the sample choice of `_one_per_task`;
    it should give way to `kbverify.score.score_rows` so that `score` and the reports share one code path.
    """
    from kbverify import stats  # deferred: scipy is only needed when a report is made

    correct = [v.correct for v in verdicts]
    speedups = [v.speedup for v in verdicts]
    lows = [v.speedup_ci[0] if v.speedup_ci else None for v in verdicts]
    claimed = [v.claimed_speedup for v in verdicts]
    claimed_any = any(c is not None for c in claimed)
    rows = []
    for p in ps:
        row = {"p": p, "n": len(verdicts), "fast_p": stats.fast_p(correct, speedups, p),
               "confident_fast_p": stats.confident_fast_p(correct, lows, p)}
        if confidence_interval:
            row["fast_p_ci"] = list(stats.bootstrap_fast_p_ci(correct, speedups, p)) if verdicts else None
        # A claim is a published "correct and this fast"; a missing claim counts as not fast, like a failure.
        row["claimed_fast_p"] = stats.fast_p([c is not None for c in claimed], claimed, p) if claimed_any else None
        rows.append(row)
    return rows


def _curve(verdicts: list[Verdict]) -> dict:
    """fast_p at every p where it changes: the exact step function, for the plot."""
    measured = sorted(v.speedup for v in verdicts if v.correct and _positive(v.speedup))
    claimed = sorted(v.claimed_speedup for v in verdicts if _positive(v.claimed_speedup))
    return {"n": len(verdicts), "measured": measured, "claimed": claimed}


def _claimed_summary(verdicts: Sequence[Verdict]) -> dict:
    claims = {_identity(v): v.claimed_speedup for v in verdicts if v.claimed_speedup is not None}
    values = list(claims.values())
    return {"n": len(values), "mean": _mean(values), "max": max(values) if values else None}


def _unverifiable(verdicts: Sequence[Verdict]) -> dict:
    rows = {}
    for verdict in verdicts:
        if verdict.status is Status.UNVERIFIABLE:
            rows.setdefault(_identity(verdict), {
                "task": verdict.task, "task_name": verdict.task_name, "submission": verdict.submission,
                "claimed_speedup": verdict.claimed_speedup, "why": verdict.message})
    items = sorted(rows.values(), key=lambda r: -(r["claimed_speedup"] or 0.0))
    with_claim = [r["claimed_speedup"] for r in items if r["claimed_speedup"] is not None]
    return {"n": len(items), "n_with_claim": len(with_claim), "mean_claimed": _mean(with_claim), "items": items}


def status_changes(verdicts: Sequence[Verdict], protocols: Sequence[str] | None = None) -> list[dict]:
    """Every (task, submission) whose status differs between consecutive protocols, with the evidence."""
    protocols = list(protocols or dict.fromkeys(v.protocol for v in verdicts))
    by_identity: dict[tuple, dict[str, Verdict]] = defaultdict(dict)
    for verdict in verdicts:
        by_identity[_identity(verdict)].setdefault(verdict.protocol, verdict)
    changes = []
    for group in by_identity.values():
        present = [name for name in protocols if name in group]
        for before_name, after_name in zip(present, present[1:]):
            before, after = group[before_name], group[after_name]
            if before.status is after.status:
                continue
            failing = after if not after.correct else before
            changes.append({
                "task": after.task, "task_name": after.task_name, "level": after.level,
                "problem_id": after.problem_id,
                "submission": after.submission,
                "from_protocol": before_name, "from_status": before.status.value,
                "to_protocol": after_name, "to_status": after.status.value,
                "change": f"{before.status.value} → {after.status.value}",
                "evidence": _evidence(failing),
                "claimed_speedup": after.claimed_speedup,
                "from_speedup": before.speedup, "to_speedup": after.speedup,
            })
    return sorted(changes, key=lambda c: (c["from_protocol"], c["to_protocol"], c["change"], c["level"] or 0,
                                          c["problem_id"] or 0, c["task_name"], c["submission"]))


def _evidence(verdict: Verdict) -> dict:
    """The input set that decided a failing verdict, else its message."""
    candidates = [s for s in verdict.sets if s.status is verdict.status] or \
                 [s for s in verdict.sets if s.valid and not s.status.passed]
    if candidates:
        first = candidates[0]
        detail = first.detail or verdict.message
        return {"protocol": verdict.protocol, "set_id": first.set_id, "detail": detail or "no detail recorded"}
    return {"protocol": verdict.protocol, "set_id": None, "detail": verdict.message or "no detail recorded"}


def code_path_mismatches(verdicts: Sequence[Verdict]) -> list[dict]:
    """Verdicts whose measured code is not the claimed one: native code that never built or never ran."""
    rows = []
    for verdict in verdicts:
        reasons = []
        build = verdict.build
        if build is not None and build.native_sources:
            if build.extension_built is False:
                cause = f" ({build.error_class})" if build.error_class else ""
                reasons.append(f"native sources, extension not built{cause}")
            elif build.extension_built and build.extension_called is False:
                reasons.append("extension built but never called in forward")
        if Warn.EXTENSION_NOT_BUILT.value in verdict.warnings and not any("not built" in r for r in reasons):
            reasons.append("extension not built")
        if Warn.PYTORCH_ONLY.value in verdict.warnings:
            reasons.append("PyTorch only: no custom kernel ran")
        if reasons:
            rows.append({"task": verdict.task, "task_name": verdict.task_name, "submission": verdict.submission,
                         "protocol": verdict.protocol, "status": verdict.status.value, "speedup": verdict.speedup,
                         "claimed_speedup": verdict.claimed_speedup, "reasons": reasons,
                         "error": build.error if build is not None else ""})
    return rows


def memory_rows(verdicts: Sequence[Verdict]) -> list[dict]:
    """Peak GPU memory of each kernel against its reference's, largest ratio first."""
    rows = []
    for verdict in verdicts:
        cand = verdict.timing.get("peak_memory_bytes")
        ref = verdict.timing.get("ref_peak_memory_bytes")
        if not isinstance(cand, (int, float)) or not isinstance(ref, (int, float)):
            continue
        rows.append({"task": verdict.task, "task_name": verdict.task_name, "submission": verdict.submission,
                     "protocol": verdict.protocol, "peak_memory_bytes": int(cand), "ref_peak_memory_bytes": int(ref),
                     "ratio": cand / ref if ref > 0 else None})
    return sorted(rows, key=lambda r: -(r["ratio"] if r["ratio"] is not None else math.inf))


def _provenance(verdicts: Sequence[Verdict], given: dict | None) -> dict:
    """The run's provenance as given, plus every distinct value the verdicts record per key."""
    seen: dict[str, list] = defaultdict(list)
    for verdict in verdicts:
        for key, value in verdict.provenance.items():
            if not isinstance(value, (dict, list)) and value not in seen[key]:
                seen[key].append(value)
    return {"run": dict(given or {}), "verdicts": {k: v for k, v in sorted(seen.items())}}


def _identity(verdict: Verdict) -> tuple:
    return (verdict.task, verdict.submission, verdict.sample)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _mean(values) -> float | None:
    values = [v for v in values if _positive(v)]
    return statistics.fmean(values) if values else None


def _geomean(values) -> float | None:
    values = [v for v in values if _positive(v)]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def _level_name(level: int | None) -> str:
    return f"level{level}" if level is not None else "unknown"


# --- writing ---------------------------------------------------------------------------------------------------------

def write_reports(verdicts: Sequence[Verdict], out_dir: str | Path, *, title: str = "kbverify report",
                  provenance: dict | None = None) -> dict[str, Path]:
    """Write report.json, report.md and report.html into `out_dir`; returns their paths by format."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(verdicts, title=title, provenance=provenance)
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


# --- formatting ------------------------------------------------------------------------------------------------------

def _pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.1f}%"


def _ci(interval) -> str:
    return "" if not interval else f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def _x(value: float | None) -> str:
    if value is None:
        return "–"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f}×"


def _bytes(value: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _fast_p_header(summary: dict) -> tuple[list[str], list[list[str]]]:
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
            row.append(_pct(first.get("claimed_fast_p")))
        for name in protocols:
            cell = summary["by_protocol"][name]["fast_p"][index]
            row += [_pct(cell["fast_p"]) + _ci(cell.get("fast_p_ci")), _pct(cell["confident_fast_p"])]
        rows.append(row)
    return header, rows


def _overview_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["protocol", "samples", "tasks", "passed", "geomean (passed)", "mean, failures as 1×", "mean claimed"]
    rows = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        rows.append([name, s["samples"], str(s["n_tasks"]), f"{s['passed']} ({_pct(s['passed'] / s['n_tasks'])})"
                     if s["n_tasks"] else "0", _x(s["geomean_speedup_passed"]), _x(s["mean_speedup_failures_as_1"]),
                     f"{_x(s['mean_claimed'])} (n={s['n_claimed']})"])
    return header, rows


def _level_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["protocol", "level", "tasks", "passed", "fast_0", "fast_1", "fast_2", "geomean (passed)",
              "mean claimed"]
    rows = []
    for name in summary["protocols"]:
        for level, s in summary["by_protocol"][name]["per_level"].items():
            rows.append([name, level, str(s["n_tasks"]), str(s["passed"]), _pct(s["fast_p"]["0.0"]),
                         _pct(s["fast_p"]["1.0"]), _pct(s["fast_p"]["2.0"]), _x(s["geomean_speedup_passed"]),
                         _x(s["mean_claimed"])])
    return header, rows


def _change_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["level", "task", "submission", "change", "protocols", "claimed", "evidence"]
    rows = []
    for c in summary["status_changes"]:
        evidence = c["evidence"]
        where = f"{evidence['protocol']} · set {evidence['set_id']}: " if evidence["set_id"] else \
            f"{evidence['protocol']}: "
        rows.append([_level_name(c["level"]), c["task_name"], c["submission"], c["change"],
                     f"{c['from_protocol']} → {c['to_protocol']}", _x(c["claimed_speedup"]),
                     where + _one_line(evidence["detail"])])
    return header, rows


def _transition_counts(summary: dict) -> list[tuple[str, int]]:
    counts = Counter(f"{c['from_protocol']} → {c['to_protocol']}: {c['change']}" for c in summary["status_changes"])
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _code_path_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    header = ["task", "submission", "protocol", "status", "measured", "claimed", "what ran"]
    rows = [[r["task_name"], r["submission"], r["protocol"], r["status"], _x(r["speedup"]), _x(r["claimed_speedup"]),
             "; ".join(r["reasons"])] for r in summary["code_path"]]
    return header, rows


def _memory_per_kernel(summary: dict) -> list[dict]:
    """One row per kernel: the protocol run that saw the largest ratio (each protocol measures its own peak)."""
    kept: dict[tuple, dict] = {}
    for row in summary["memory"]:  # already sorted, largest ratio first
        kept.setdefault((row["task"], row["submission"]), row)
    return list(kept.values())


def _memory_rows_text(summary: dict, limit: int) -> tuple[list[str], list[list[str]]]:
    header = ["task", "submission", "protocol", "kernel peak", "reference peak", "ratio"]
    rows = [[r["task_name"], r["submission"], r["protocol"], _bytes(r["peak_memory_bytes"]),
             _bytes(r["ref_peak_memory_bytes"]), "–" if r["ratio"] is None else f"{r['ratio']:.2f}×"]
            for r in _memory_per_kernel(summary)[:limit]]
    return header, rows


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- Markdown --------------------------------------------------------------------------------------------------------

def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(summary: dict, *, memory_limit: int = 20) -> str:
    out = [f"# {summary['title']}", ""]
    n_claims, unverifiable = summary["claimed"]["n"], summary["unverifiable"]
    out += [f"{len(summary['verdicts'])} verdicts under {', '.join(summary['protocols']) or 'no protocol'}; "
            f"{n_claims} claimed speedups (mean {_x(summary['claimed']['mean'])}); "
            f"{unverifiable['n']} claims cannot be verified (no code or no task).", ""]
    out += ["## fast_p", "", "Share of all tasks that are correct and faster than p× (failures and unverifiable "
            "claims stay in the denominator); *confident*: the lower 95% bound of the speedup is above p.", ""]
    out += [_md_table(*_fast_p_header(summary)), "", _md_table(*_overview_rows(summary)), ""]
    out += ["## Per level", "", _md_table(*_level_rows(summary)), ""]
    out += ["## Status changes between protocols", ""]
    if summary["status_changes"]:
        out += [f"- {label}: {count}" for label, count in _transition_counts(summary)]
        out += ["", _md_table(*_change_rows(summary)), ""]
    else:
        out += ["None.", ""]
    out += ["## Measured code path differs from the claimed one", ""]
    out += [_md_table(*_code_path_rows(summary)) if summary["code_path"] else "None found.", ""]
    if summary["memory"]:
        out += ["## Peak GPU memory against the reference", "", _memory_summary_line(summary), "",
                _md_table(*_memory_rows_text(summary, memory_limit)), ""]
    if unverifiable["n"]:
        out += ["## Unverifiable claims", "",
                f"{unverifiable['n']} entries cannot be verified; {unverifiable['n_with_claim']} of them carry a "
                f"claimed speedup (mean {_x(unverifiable['mean_claimed'])}).", ""]
    out += ["## Provenance", "", "```json", json.dumps(_json_safe(summary["provenance"]), indent=1), "```", ""]
    return "\n".join(out)


def _memory_summary_line(summary: dict) -> str:
    ratios = [r["ratio"] for r in _memory_per_kernel(summary) if r["ratio"] is not None]
    if not ratios:
        return "No reference peak recorded."
    above = sum(r > 2 for r in ratios)
    return (f"{len(ratios)} kernels measured; median ratio {statistics.median(ratios):.2f}×; "
            f"{above} use more than twice the reference's peak (per kernel, the protocol run with the largest ratio).")


def render_markdown_summary(verdicts: Sequence[Verdict]) -> str:
    """A short table for the terminal: per protocol, tasks, passed, fast_p and the geometric-mean speedup."""
    summary = summarize(verdicts)
    header = ["protocol", "tasks", "passed"] + [f"fast_{p:g}" for p in P_VALUES] + ["geomean (passed)"]
    rows = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        rows.append([name, str(s["n_tasks"]), str(s["passed"])] + [_pct(r["fast_p"]) for r in s["fast_p"]]
                    + [_x(s["geomean_speedup_passed"])])
    if summary["claimed"]["n"] and summary["protocols"]:
        first = summary["by_protocol"][summary["protocols"][0]]
        rows.append([CLAIMED, str(first["n_tasks"]), "–"] + [_pct(r["claimed_fast_p"]) for r in first["fast_p"]]
                    + ["–"])
    lines = [_md_table(header, rows)]
    if summary["status_changes"]:
        lines.append(f"{len(summary['status_changes'])} status changes between protocols.")
    if summary["unverifiable"]["n"]:
        lines.append(f"{summary['unverifiable']['n']} claims cannot be verified.")
    return "\n".join(lines) + "\n"


# --- HTML --------------------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2733;margin:0;background:#f4f6f8}
main{max-width:1120px;margin:0 auto;padding:24px 32px 48px;background:#fff}
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
details summary{cursor:pointer;color:#1b6ca8}
.muted{color:#5b6875}
td.nowrap,td.num{white-space:nowrap}
"""


def _h(text) -> str:
    return html.escape(str(text), quote=True)


def _html_table(header: list[str], rows: list[list[str]], *, numeric: set[int] = frozenset(),
                raw: set[int] = frozenset(), nowrap: set[int] = frozenset()) -> str:
    def cell(tag: str, index: int, text: str) -> str:
        classes = " ".join(name for name, cols in (("num", numeric), ("nowrap", nowrap)) if index in cols)
        cls = f' class="{classes}"' if classes else ""
        return f"<{tag}{cls}>{text if index in raw else _h(text)}</{tag}>"
    head = "".join(cell("th", i, t) for i, t in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, t) for i, t in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _status_html(status: str) -> str:
    cls = "status-passed" if status == Status.PASSED.value else "status-fail"
    return f'<span class="{cls}">{_h(status)}</span>'


def render_html(summary: dict, *, memory_limit: int = 100) -> str:
    colours = {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(summary["protocols"])}
    parts = [f"<h1>{_h(summary['title'])}</h1>",
             f'<p class="lead">{len(summary["verdicts"])} verdicts · protocols '
             f'{_h(", ".join(summary["protocols"]) or "none")} · kbverify {_h(summary["kbverify_version"])}</p>',
             _cards(summary)]

    parts.append("<h2>fast_p</h2><p class=\"muted\">Share of all tasks that are correct and faster than p× "
                 "(failures and unverifiable claims stay in the denominator); <i>confident</i>: the lower 95% "
                 "bound of the kernel's speedup is above p. Bracketed: 95% bootstrap interval over tasks.</p>")
    header, rows = _fast_p_header(summary)
    parts.append(_html_table(header, rows, numeric=set(range(1, len(header)))))
    header, rows = _overview_rows(summary)
    parts.append(_html_table(header, rows, numeric=set(range(2, len(header)))))
    parts.append('<div class="plots">' + _figure(svg_fast_p_curves(summary, colours),
                 "fast_p as a function of p, every protocol (solid) and the published claims (dashed).")
                 + _figure(svg_claimed_vs_measured(summary, colours),
                           "Claimed against measured speedup (log–log), one point per verdict. Filled: passed; "
                           "hollow: failed but timed; × on the bottom strip: failed, not timed. Dashed: "
                           "measured = claimed.") + "</div>")

    parts.append("<h2>Per level</h2>")
    header, rows = _level_rows(summary)
    parts.append(_html_table(header, rows, numeric=set(range(2, len(header)))))

    parts.append("<h2>Status changes between protocols</h2>")
    if summary["status_changes"]:
        counts = "".join(f"<li>{_h(label)}: <b>{count}</b></li>" for label, count in _transition_counts(summary))
        parts.append(f"<ul>{counts}</ul>")
        header, rows = _change_rows(summary)
        change_column = header.index("change")
        for row, change in zip(rows, summary["status_changes"]):
            row[:] = [_h(cell) for cell in row]
            row[change_column] = f"{_status_html(change['from_status'])} → {_status_html(change['to_status'])}"
        parts.append(_html_table(header, rows, raw=set(range(len(header))), nowrap={3, 4}, numeric={5}))
    else:
        parts.append("<p>None.</p>")

    parts.append("<h2>Measured code path differs from the claimed one</h2>")
    if summary["code_path"]:
        parts.append(_html_table(*_code_path_rows(summary), numeric={4, 5}))
    else:
        parts.append("<p>None found.</p>")

    if summary["memory"]:
        parts.append("<h2>Peak GPU memory against the reference</h2>")
        parts.append(f"<p>{_h(_memory_summary_line(summary))}</p>")
        header, rows = _memory_rows_text(summary, memory_limit)
        parts.append(_html_table(header, rows[:10], numeric={3, 4, 5}))
        if rows[10:]:
            parts.append(f"<details><summary>{len(rows) - 10} more</summary>"
                         + _html_table(header, rows[10:], numeric={3, 4, 5}) + "</details>")

    unverifiable = summary["unverifiable"]
    if unverifiable["n"]:
        parts.append("<h2>Unverifiable claims</h2>")
        parts.append(f"<p>{unverifiable['n']} entries cannot be verified; {unverifiable['n_with_claim']} carry a "
                     f"claimed speedup (mean {_h(_x(unverifiable['mean_claimed']))}).</p>")
        rows = [[r["task_name"], r["submission"], _x(r["claimed_speedup"]), _one_line(r["why"])]
                for r in unverifiable["items"]]
        parts.append("<details><summary>List</summary>"
                     + _html_table(["task", "submission", "claimed", "why"], rows, numeric={2}) + "</details>")

    parts.append("<h2>Provenance</h2><pre>" + _h(json.dumps(_json_safe(summary["provenance"]), indent=1)) + "</pre>")
    body = "\n".join(parts)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_h(summary['title'])}</title><style>{_CSS}</style></head>\n<body><main>\n{body}\n"
            f"</main></body></html>\n")


def _cards(summary: dict) -> str:
    cards = []
    for name in summary["protocols"]:
        s = summary["by_protocol"][name]
        fast1 = next(r["fast_p"] for r in s["fast_p"] if r["p"] == 1.0) if s["fast_p"] else None
        cards.append((f"{_pct(fast1)}", f"fast_1 · {name}"))
    if summary["claimed"]["n"]:
        cards.append((_x(summary["claimed"]["mean"]), f"mean claimed speedup (n={summary['claimed']['n']})"))
    cards.append((str(len(summary["status_changes"])), "status changes"))
    cards.append((str(summary["unverifiable"]["n"]), "unverifiable claims"))
    return '<div class="cards">' + "".join(f'<div class="card"><b>{_h(v)}</b><span>{_h(k)}</span></div>'
                                           for v, k in cards) + "</div>"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_h(caption)}</figcaption></figure>"


# --- SVG plots -------------------------------------------------------------------------------------------------------

_W, _H = 520, 360
_M = {"left": 56, "right": 16, "top": 16, "bottom": 64}


def _svg_open(label: str) -> list[str]:
    # Inline SVG in HTML needs no namespace declaration; leaving it out keeps the page free of any URL.
    return [f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'role="img" aria-label="{_h(label)}" font-family="system-ui,sans-serif" font-size="11">',
            f'<rect width="{_W}" height="{_H}" fill="#fff"/>']


def _legend(items: list[tuple[str, str, bool]], y: float) -> list[str]:
    out, x = [], _M["left"]
    for label, colour, dashed in items:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 18}" y2="{y}" stroke="{colour}" stroke-width="2.5"{dash}/>')
        out.append(f'<text x="{x + 23}" y="{y + 4}">{_h(label)}</text>')
        x += 32 + 7 * len(label)
    return out


def svg_fast_p_curves(summary: dict, colours: dict[str, str]) -> str:
    """fast_p(p) step curves for every protocol, and the claimed curve, on one plot."""
    curves = []
    for name in summary["protocols"]:
        curve = summary["by_protocol"][name]["curve"]
        curves.append((name, colours[name], False, curve["measured"], curve["n"]))
    if summary["claimed"]["n"] and summary["protocols"]:
        first = summary["by_protocol"][summary["protocols"][0]]["curve"]
        curves.append((CLAIMED, _CLAIMED_COLOUR, True, first["claimed"], first["n"]))
    values = [v for *_, speedups, _ in curves for v in speedups]
    # Long tails (a 368× claim) would flatten the interesting range: cut the axis near the 90th percentile.
    top = sorted(values)[int(0.9 * (len(values) - 1))] if values else 2.0
    p_max = min(10.0, max(2.5, math.ceil(top * 1.1 * 2) / 2))
    plot_w, plot_h = _W - _M["left"] - _M["right"], _H - _M["top"] - _M["bottom"]

    def sx(p: float) -> float:
        return _M["left"] + plot_w * p / p_max

    def sy(share: float) -> float:
        return _M["top"] + plot_h * (1 - share)

    out = _svg_open("fast_p over p")
    step = 0.5 if p_max <= 5 else 1.0
    for i in range(int(p_max / step) + 1):
        p = i * step
        out.append(f'<line x1="{sx(p):.1f}" y1="{sy(0):.1f}" x2="{sx(p):.1f}" y2="{sy(1):.1f}" stroke="#eceff2"/>')
        out.append(f'<text x="{sx(p):.1f}" y="{sy(0) + 14:.1f}" text-anchor="middle">{p:g}</text>')
    for share in (0, 0.25, 0.5, 0.75, 1):
        out.append(f'<line x1="{sx(0):.1f}" y1="{sy(share):.1f}" x2="{sx(p_max):.1f}" y2="{sy(share):.1f}" '
                   f'stroke="#eceff2"/>')
        out.append(f'<text x="{sx(0) - 6:.1f}" y="{sy(share) + 4:.1f}" text-anchor="end">{int(share * 100)}%</text>')
    out.append(f'<rect x="{sx(0):.1f}" y="{sy(1):.1f}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="#9aa5b1"/>')
    out.append(f'<text x="{sx(p_max / 2):.1f}" y="{sy(0) + 30:.1f}" text-anchor="middle">p (speedup threshold)</text>')
    out.append(f'<text transform="translate(14 {sy(0.5):.1f}) rotate(-90)" text-anchor="middle">fast_p</text>')
    for name, colour, dashed, speedups, n in curves:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        points = _step_points(speedups, n, p_max)
        path = " ".join(f"{sx(p):.1f},{sy(share):.1f}" for p, share in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2.2"{dash}>'
                   f'<title>{_h(name)}</title></polyline>')
    out += _legend([(name, colour, dashed) for name, colour, dashed, *_ in curves], _H - 14)
    out.append("</svg>")
    return "\n".join(out)


def _step_points(speedups: list[float], n: int, p_max: float) -> list[tuple[float, float]]:
    """Corners of fast_p(p) = #{s > p} / n on [0, p_max]; it drops just after each speedup value."""
    if n == 0:
        return [(0.0, 0.0), (p_max, 0.0)]
    values = sorted(speedups)
    points, p = [], 0.0
    share = sum(v > 0 for v in values) / n
    points.append((0.0, share))
    for v in values:
        if v >= p_max:
            break
        if v <= p:
            continue
        points.append((v, share))
        share = sum(x > v for x in values) / n
        points.append((v, share))
        p = v
    points.append((p_max, share))
    return points


def svg_claimed_vs_measured(summary: dict, colours: dict[str, str]) -> str:
    """Claimed against measured speedup, log–log, one point per verdict that has a claim."""
    points = []  # (claimed, measured | None, passed, protocol, label)
    for record in summary["verdicts"]:
        claimed = record.get("claimed_speedup")
        if not _positive(claimed):
            continue
        measured = record.get("speedup") if _positive(record.get("speedup")) else None
        label = f"{record['task_name']} · {record['protocol']}: claimed {_x(claimed)}, measured {_x(measured)}, " \
                f"{record['status']}"
        points.append((claimed, measured, record["status"] == Status.PASSED.value, record["protocol"], label))
    values = [c for c, *_ in points] + [m for _, m, *_ in points if m is not None] or [0.5, 2.0]
    lo = 10 ** math.floor(math.log10(min(min(values), 1.0) * 0.999))
    hi = 10 ** math.ceil(math.log10(max(max(values), 1.0) * 1.001))
    while hi / lo < 100:  # at least two decades, or the grid is a single square
        if lo > 0.01:
            lo /= 10
        else:
            hi *= 10
    plot_w, plot_h = _W - _M["left"] - _M["right"], _H - _M["top"] - _M["bottom"] - 18
    span = math.log10(hi) - math.log10(lo)

    def sx(v: float) -> float:
        return _M["left"] + plot_w * (math.log10(v) - math.log10(lo)) / span

    def sy(v: float) -> float:
        return _M["top"] + plot_h * (1 - (math.log10(v) - math.log10(lo)) / span)

    strip_y = _M["top"] + plot_h + 12
    out = _svg_open("claimed against measured speedup")
    decade = lo
    while decade <= hi * 1.0001:
        for minor in range(2, 10):
            v = decade * minor
            if v < hi:
                out.append(f'<line x1="{sx(v):.1f}" y1="{sy(lo):.1f}" x2="{sx(v):.1f}" y2="{sy(hi):.1f}" '
                           f'stroke="#f3f5f7"/>')
                out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(v):.1f}" x2="{sx(hi):.1f}" y2="{sy(v):.1f}" '
                           f'stroke="#f3f5f7"/>')
        out.append(f'<line x1="{sx(decade):.1f}" y1="{sy(lo):.1f}" x2="{sx(decade):.1f}" y2="{sy(hi):.1f}" '
                   f'stroke="#e1e6eb"/>')
        out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(decade):.1f}" x2="{sx(hi):.1f}" y2="{sy(decade):.1f}" '
                   f'stroke="#e1e6eb"/>')
        out.append(f'<text x="{sx(decade):.1f}" y="{strip_y + 20:.1f}" text-anchor="middle">{decade:g}×</text>')
        out.append(f'<text x="{sx(lo) - 6:.1f}" y="{sy(decade) + 4:.1f}" text-anchor="end">{decade:g}×</text>')
        decade *= 10
    out.append(f'<rect x="{sx(lo):.1f}" y="{sy(hi):.1f}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="#9aa5b1"/>')
    out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" stroke="#9aa5b1" '
               f'stroke-dasharray="4 3"/>')
    out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(1):.1f}" x2="{sx(hi):.1f}" y2="{sy(1):.1f}" stroke="#9aa5b1"/>')
    out.append(f'<text x="{sx(lo) + 4:.1f}" y="{strip_y + 3:.1f}" fill="#5b6875" font-size="9">failed, not timed'
               f'</text>')
    out.append(f'<text x="{sx(math.sqrt(lo * hi)):.1f}" y="{_H - 22}" text-anchor="middle">claimed speedup</text>')
    out.append(f'<text transform="translate(14 {sy(math.sqrt(lo * hi)):.1f}) rotate(-90)" text-anchor="middle">'
               f'measured speedup</text>')
    for claimed, measured, passed, protocol, label in points:
        colour = colours.get(protocol, _CLAIMED_COLOUR)
        x = sx(min(max(claimed, lo), hi))
        if measured is None:
            out.append(f'<path d="M{x - 3:.1f},{strip_y - 3:.1f}l6,6m0,-6l-6,6" stroke="{colour}" stroke-width="1.4">'
                       f'<title>{_h(label)}</title></path>')
            continue
        y = sy(min(max(measured, lo), hi))
        fill = colour if passed else "#fff"
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.6" fill="{fill}" fill-opacity="0.75" stroke="{colour}" '
                   f'stroke-width="1.3"><title>{_h(label)}</title></circle>')
    out += _legend([(name, colours[name], False) for name in summary["protocols"]], _H - 6)
    out.append("</svg>")
    return "\n".join(out)
