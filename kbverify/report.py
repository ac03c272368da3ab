"""Reports from verdicts: `report.json` (complete), `report.md` (papers, PRs), `report.html` (self-contained).

Everything is computed once into a plain summary (`summarize`), which the JSON stores and the Markdown and HTML
render; the HTML carries its CSS and SVG plots (`kbverify.plots`) inline, with no script and no external
resource, so it can be attached to an issue or archived as is. fast_p comes from `kbverify.score`, the code path
`kbverify score` uses, so a report and a score of the same verdicts agree.

The Markdown and the HTML show a table of every verdict and provenance as a short block (machine, software, run
ids); the full provenance record, with each run's arguments, is in the JSON alone. Evidence is cut at a word
boundary in the tables, and in the HTML the whole text is one click away.
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
from kbverify.present import shorten
from kbverify.plots import CLAIMED, protocol_colours, svg_claimed_vs_measured, svg_fast_p_curves
from kbverify.protocols import PRESETS
from kbverify.records import Verdict, task_label
from kbverify.status import Status, Warn

P_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0)


# --- summary -------------------------------------------------------------------------------------------------------

def summarize(verdicts: Sequence[Verdict], *, title: str = "kbverify report", provenance: dict | None = None,
              samples: str | None = None, group_by: str | None = None) -> dict:
    """Everything the reports show, as JSON-ready data.

    `samples` (first | best) picks one sample per task for every protocol; None uses each protocol's own rule
    (KernelBench scores the first sample, KernelBench-Verified the best). `group_by`: a label whose groups get a
    leaderboard (`kbverify.leaderboard`) under the key `leaderboard`.
    """
    protocols = list(dict.fromkeys(v.protocol for v in verdicts))
    by_protocol = {name: [v for v in verdicts if v.protocol == name] for name in protocols}
    board = None
    if group_by is not None:
        from kbverify.leaderboard import board_from_verdicts

        board = board_from_verdicts(verdicts, group_by, P_VALUES, samples=samples)
    return {
        "leaderboard": board,
        "title": title,
        "kbverify_version": __version__,
        "p_values": list(P_VALUES),
        "protocols": protocols,
        "claimed": _claimed_summary(verdicts),
        "by_protocol": {name: _protocol_summary(group, samples or samples_rule(name))
                        for name, group in by_protocol.items()},
        "status_changes": status_changes(verdicts, protocols),
        "code_path": code_path_mismatches(verdicts),
        "memory": memory_rows(verdicts),
        "unverifiable": _unverifiable(verdicts),
        "verdict_table": verdict_table(verdicts, protocols),
        "provenance_short": short_provenance(verdicts, provenance),
        "provenance": _provenance(verdicts, provenance),
        "foreign_gpu": foreign_gpu_line(verdicts),
        "verdicts": [v.to_dict() for v in verdicts],
    }


def verdict_table(verdicts: Sequence[Verdict], protocols: Sequence[str] | None = None) -> list[dict]:
    """One row per verdict, the protocols of one submission side by side, in task order."""
    order = {name: index for index, name in enumerate(protocols or dict.fromkeys(v.protocol for v in verdicts))}
    rows = []
    for verdict in sorted(verdicts, key=lambda v: (v.level is None, v.level or 0, v.problem_id is None,
                                                    v.problem_id or 0, v.task_name, v.submission, v.sample,
                                                    order.get(v.protocol, len(order)))):
        evidence = _evidence(verdict) if not verdict.correct else {
            "protocol": verdict.protocol, "set_id": None, "detail": verdict.message}
        rows.append({"task": verdict.task, "task_name": verdict.task_name, "level": verdict.level,
                     "submission": verdict.submission, "sample": verdict.sample, "protocol": verdict.protocol,
                     "status": verdict.status.value, "speedup": verdict.speedup,
                     "speedup_ci": list(verdict.speedup_ci) if verdict.speedup_ci else None,
                     "speed": verdict.speed_class, "claimed_speedup": verdict.claimed_speedup,
                     "warnings": list(verdict.warnings), "evidence": evidence})
    return rows


_SHORT_SOFTWARE = (("torch", "torch"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("triton", "Triton"),
                   ("python", "Python"))


def short_provenance(verdicts: Sequence[Verdict], given: dict | None) -> dict:
    """What a reader checks first about where the verdicts come from: machine, software, run ids, protocol hashes,
    isolation. Each value is every distinct one the verdicts (or, without theirs, the runs) record, so a store
    that mixes machines says so. The full record is `_provenance`'s, in the JSON."""
    runs = [run for run in (given or {}).get("runs", []) if isinstance(run, dict)]
    records = [v.provenance for v in verdicts if v.provenance] or [run.get("provenance") or {} for run in runs]

    def values(key: str) -> list:
        return list(dict.fromkeys(r.get(key) for r in records if r.get(key) not in (None, "")))

    gpus = values("gpu_model") or values("gpu_name") or values("gpu")
    if gpus:
        machine = " / ".join(map(str, gpus))
        drivers = values("driver")
        machine += f", driver {' / '.join(map(str, drivers))}" if drivers else ""
    else:
        machine = "CPU only" + (f" ({' / '.join(map(str, values('host_cpu')))})" if values("host_cpu") else "")
    kbverify = " / ".join(map(str, values("kbverify"))) or __version__
    details = [f"commit {str(c)[:10]}" for c in values("kbverify_commit")]
    details += [f"sources {str(c)[:10]}" for c in values("kbverify_source_sha256")]
    software = [f"kbverify {kbverify}" + (f" ({', '.join(details)})" if details else "")]
    software += [f"{label} {' / '.join(map(str, values(key)))}" for key, label in _SHORT_SOFTWARE if values(key)]
    hashes: dict[str, list[str]] = {}
    for verdict in verdicts:
        known = hashes.setdefault(verdict.protocol, [])
        if verdict.protocol_sha256 and verdict.protocol_sha256[:12] not in known:
            known.append(verdict.protocol_sha256[:12])
    # how each verdict's submission processes were confined (Verdict.isolation; older records say "degraded")
    isolation = [v.isolation for v in verdicts if v.isolation]
    return {"machine": machine, "mixed_machines": len(gpus) > 1 or len(values("host_cpu")) > 1,
            "software": software, "runs": [_run_line(run) for run in runs],
            "protocols": {name: known for name, known in hashes.items()},
            "isolation": list(dict.fromkeys(isolation))}


def _run_line(run: dict) -> str:
    import datetime

    arguments = run.get("arguments") or {}
    parts = [str(run.get("run_id", "?"))]
    if isinstance(run.get("started"), (int, float)):
        parts.append(datetime.datetime.fromtimestamp(run["started"], datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"))
    if arguments.get("source"):
        parts.append(f"source {arguments['source']}")
    if arguments.get("protocols"):
        parts.append("protocols " + ", ".join(arguments["protocols"]))
    if arguments.get("planned_units"):
        parts.append(f"{len(arguments['planned_units'])} units planned")
    for note in arguments.get("notes", []):
        if isinstance(note, dict) and note.get("rejudged"):
            parts.append(f"rejudged under {note['rejudged']}")
    return " · ".join(parts)


def score_rows_from_verdicts(verdicts: Sequence[Verdict]) -> list:
    """One `kbverify.score.ScoreRow` per verdict; a task is `level<L>/<name>`, or its name when the level is unknown."""
    from kbverify.score import ScoreRow  # deferred: scipy is only needed when something is scored

    # A timing taken while another process held the GPU measured the machine as much as the kernel: it stays
    # correct and its speed counts for nothing, so fast_p is a lower bound until it is timed on an idle GPU.
    return [ScoreRow(task=task_label(v.task_name, v.level), level=v.level,
                     sample=v.sample, correct=v.correct, speedup=None if timed_beside_foreign(v) else v.speedup,
                     speedup_ci_low=v.speedup_ci[0] if v.speedup_ci and not timed_beside_foreign(v) else None,
                     claimed_speedup=v.claimed_speedup, labels=tuple(sorted(v.labels.items())))
            for v in verdicts]


def timed_beside_foreign(verdict: Verdict) -> bool:
    return Warn.FOREIGN_GPU_PROCESS.value in verdict.warnings


def foreign_gpu_line(verdicts: Sequence[Verdict]) -> str:
    """"" when no verdict was timed beside a foreign GPU process; else what a reader of the fast_p tables must know."""
    count = sum(1 for v in verdicts if timed_beside_foreign(v))
    if not count:
        return ""
    return (f"foreign_gpu_process: {count} verdict(s) were timed while a process not kbverify's own held the GPU; "
            f"their speedups are not counted in fast_p (a lower bound). Time them again on an idle GPU.")


def samples_rule(protocol: str) -> str:
    """How a protocol picks one sample per task: a preset's own rule, else the first sample."""
    preset = PRESETS.get(protocol)
    return preset.samples if preset is not None else "first"


def _protocol_summary(verdicts: list[Verdict], samples: str) -> dict:
    from kbverify.score import score_rows, select_samples

    rows = score_rows_from_verdicts(verdicts)
    verdict_of = {id(row): verdict for row, verdict in zip(rows, verdicts)}
    chosen = [verdict_of[id(row)] for row in select_samples(rows, samples)]
    table = score_rows(rows, P_VALUES, samples=samples)
    passed_speedups = [v.speedup for v in chosen if v.correct and _positive(v.speedup)]
    levels = sorted({v.level for v in chosen}, key=lambda level: (level is None, level or 0))
    return {
        "samples": samples,
        "n_verdicts": len(verdicts),
        "n_tasks": table.n_tasks,
        "status_counts": dict(Counter(v.status.value for v in verdicts).most_common()),
        "warning_counts": dict(Counter(w for v in verdicts for w in v.warnings).most_common()),
        "fast_p": _fast_p_rows(table, chosen),
        "curve": _curve(chosen),
        "passed": table.n_correct,
        "geomean_speedup_passed": table.geomean.speedup if table.geomean else None,
        "geomean_speedup_passed_ci": [table.geomean.ci_low, table.geomean.ci_high] if table.geomean else None,
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


def _level_summary(chosen: list[Verdict]) -> dict:
    """One level's share of the table; `chosen` already holds one verdict per task."""
    from kbverify.score import score_rows

    table = score_rows(score_rows_from_verdicts(chosen), P_VALUES)
    return {
        "n_tasks": table.n_tasks,
        "passed": table.n_correct,
        "fast_p": {str(entry.p): entry.fast_p for entry in table.fast},
        "geomean_speedup_passed": table.geomean.speedup if table.geomean else None,
        "mean_claimed": _mean([v.claimed_speedup for v in chosen]),
        "n_claimed": sum(v.claimed_speedup is not None for v in chosen),
    }


def fast_p_table(verdicts: Sequence[Verdict], ps: Sequence[float] = P_VALUES, *, samples: str = "first") -> list[dict]:
    """fast_p per p over one sample per task (failures stay in the denominator), with the claimed fast_p."""
    from kbverify.score import score_rows, select_samples

    rows = score_rows_from_verdicts(verdicts)
    verdict_of = {id(row): verdict for row, verdict in zip(rows, verdicts)}
    chosen = [verdict_of[id(row)] for row in select_samples(rows, samples)]
    return _fast_p_rows(score_rows(rows, ps, samples=samples), chosen)


def _fast_p_rows(table, chosen: Sequence[Verdict]) -> list[dict]:
    """A score table's rows as the report shows them, with the fast_p the authors' claims imply."""
    from kbverify import stats

    claimed = [v.claimed_speedup for v in chosen]
    claimed_any = any(c is not None for c in claimed)
    rows = []
    for entry in table.fast:
        rows.append({
            "p": entry.p, "n": table.n_tasks, "fast_p": entry.fast_p, "n_fast": entry.n_fast,
            "fast_p_ci": [entry.ci_low, entry.ci_high],
            # None when no kernel carries a speedup CI (the original protocol times without one).
            "confident_fast_p": entry.confident_fast_p,
            # A claim is a published "correct and this fast"; a missing claim counts as not fast, like a failure.
            "claimed_fast_p": stats.fast_p([c is not None for c in claimed], claimed, entry.p) if claimed_any
            else None,
        })
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


def _level_name(level: int | None) -> str:
    return f"level{level}" if level is not None else "unknown"


# --- writing ---------------------------------------------------------------------------------------------------------

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
    return shorten(text, limit)


def _speed_cell(row: dict) -> str:
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


def _verdict_rows(summary: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """The every-verdict table: header, rows of text, and each row's whole evidence (the last cell, shortened)."""
    header = ["level", "task", "submission", "protocol", "status", "speedup [95% CI]", "claimed", "warnings",
              "evidence"]
    rows, evidence = [], []
    for row in summary["verdict_table"]:
        whole = _evidence_text(row["evidence"])
        cells = [_level_name(row["level"]), row["task_name"], _submission_label(row), row["protocol"], row["status"],
                 _speed_cell(row), _x(row["claimed_speedup"]), ", ".join(row["warnings"]),
                 _one_line(whole, EVIDENCE_CHARS)]
        rows.append(cells)
        evidence.append(whole)
    return header, rows, evidence


EVIDENCE_CHARS = 160
_VERDICTS_NOTE = ("speedup: the PyTorch reference's time over the kernel's (above 1× is faster), with its 95% "
                  "interval; faster, slower, same or ambiguous says where that interval lies against the noise "
                  "margin (ambiguous: it straddles it). KernelBench's own timing (original) gives no interval.")


def _provenance_items(summary: dict) -> list[tuple[str, str]]:
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


_PROVENANCE_NOTE = ("The full record (every verdict's provenance, each run's arguments and planned units) is in "
                    "report.json.")


def _degraded(summary: dict) -> bool:
    return any(str(value) == "degraded" for value in summary["provenance_short"]["isolation"])


_DEGRADED = ("isolation: degraded. This machine allowed no sandbox, so the candidates' processes could reach "
             "what the verdicts depend on; treat these verdicts as unhardened.")


# --- Markdown --------------------------------------------------------------------------------------------------------

def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(summary: dict, *, memory_limit: int = 20) -> str:
    out = [f"# {summary['title']}", ""]
    if _degraded(summary):
        out += [f"**{_DEGRADED}**", ""]
    if summary.get("foreign_gpu"):
        out += [f"**{summary['foreign_gpu']}**", ""]
    n_claims, unverifiable = summary["claimed"]["n"], summary["unverifiable"]
    out += [f"{len(summary['verdicts'])} verdicts under {', '.join(summary['protocols']) or 'no protocol'}; "
            f"{n_claims} claimed speedups (mean {_x(summary['claimed']['mean'])}); "
            f"{unverifiable['n']} claims cannot be verified (no code or no task).", ""]
    out += ["## fast_p", "", "Share of all tasks that are correct and faster than p× (failures and unverifiable "
            "claims stay in the denominator); *confident*: the lower 95% bound of the speedup is above p. Under "
            "protocols with a clean reference that bound includes what a rerun redraws (each model copy's own "
            "offset), not only the run's own noise.", ""]
    out += [_md_table(*_fast_p_header(summary)), "", _md_table(*_overview_rows(summary)), ""]
    out += ["## Per level", "", _md_table(*_level_rows(summary)), ""]
    if summary.get("leaderboard"):
        from kbverify.leaderboard import render_markdown as leaderboard_markdown

        out += [leaderboard_markdown(summary["leaderboard"])]
    out += ["## Status changes between protocols", ""]
    if summary["status_changes"]:
        out += [f"- {label}: {count}" for label, count in _transition_counts(summary)]
        out += ["", _md_table(*_change_rows(summary)), ""]
    else:
        out += ["None.", ""]
    header, rows, _ = _verdict_rows(summary)
    out += ["## Every verdict", "", _VERDICTS_NOTE + " Evidence is shortened here; report.json has it whole.", "",
            _md_table(header, rows), ""]
    out += ["## Measured code path differs from the claimed one", ""]
    out += [_md_table(*_code_path_rows(summary)) if summary["code_path"] else "None found.", ""]
    if summary["memory"]:
        out += ["## Peak GPU memory against the reference", "", _memory_summary_line(summary), "",
                _md_table(*_memory_rows_text(summary, memory_limit)), ""]
    if unverifiable["n"]:
        out += ["## Unverifiable claims", "",
                f"{unverifiable['n']} entries cannot be verified; {unverifiable['n_with_claim']} of them carry a "
                f"claimed speedup (mean {_x(unverifiable['mean_claimed'])}).", ""]
    out += ["## Provenance", ""] + [f"- **{key}**: {value}" for key, value in _provenance_items(summary)]
    out += ["", _PROVENANCE_NOTE, ""]
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
    text = _speed_cell({**row, "speed": None})
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
    colours = protocol_colours(summary["protocols"])
    parts = [f"<h1>{_h(summary['title'])}</h1>",
             f'<p class="lead">{len(summary["verdicts"])} verdicts · protocols '
             f'{_h(", ".join(summary["protocols"]) or "none")} · kbverify {_h(summary["kbverify_version"])}</p>',
             *([f'<p class="alert">{_h(_DEGRADED)}</p>'] if _degraded(summary) else []),
             *([f'<p class="alert">{_h(summary["foreign_gpu"])}</p>'] if summary.get("foreign_gpu") else []),
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
    if summary.get("leaderboard"):
        from kbverify.leaderboard import render_html as leaderboard_html

        parts.append(leaderboard_html(summary["leaderboard"]))

    parts.append("<h2>Status changes between protocols</h2>")
    if summary["status_changes"]:
        counts = "".join(f"<li>{_h(label)}: <b>{count}</b></li>" for label, count in _transition_counts(summary))
        parts.append(f"<ul>{counts}</ul>")
        header, rows = _change_rows(summary)
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
    else:
        parts.append("<p>None.</p>")

    parts.append(f'<h2 id="verdicts">Every verdict</h2><p class="muted">{_h(_VERDICTS_NOTE)}</p>')
    header, rows, evidence = _verdict_rows(summary)
    status_column = header.index("status")
    speed_column = header.index("speedup [95% CI]")
    for row, whole, data in zip(rows, evidence, summary["verdict_table"]):
        status = row[status_column]
        row[:] = [_h(cell) for cell in row]
        row[status_column] = _status_html(status)
        row[speed_column] = _speed_html(data)
        row[1] = row[1].replace("_", "_<wbr>")  # long task names break after an underscore, not mid-word
        row[-1] = _details_html(whole)
    parts.append(_html_table(header, rows, raw=set(range(len(header))), numeric={header.index("claimed")},
                             nowrap={status_column}, table_id="verdict-table"))

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

    items = "".join(f"<dt>{_h(key)}</dt><dd>{_h(value)}</dd>" for key, value in _provenance_items(summary))
    parts.append(f'<h2>Provenance</h2><dl class="provenance">{items}</dl><p class="muted">{_h(_PROVENANCE_NOTE)}</p>')
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
