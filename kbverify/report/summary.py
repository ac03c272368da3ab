"""The report summary: everything the reports show, computed once from verdicts into plain JSON-ready data
(`summarize`), which `report.json` stores and the Markdown and HTML (`kbverify.report.write`) render.

fast_p comes from `kbverify.results.score`, the code path `kbverify score` uses, through the counting rules of
`kbverify.results.counting`. The short provenance block (machine, software, run ids) is what the Markdown and HTML show;
the full provenance record, with each run's arguments, is in the JSON alone.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Sequence

from kbverify import __version__
from kbverify.results.counting import (failing_evidence, foreign_gpu_line, identity, samples_rule, score_rows_from_verdicts,
                               status_changes)
from kbverify.core.records import Verdict
from kbverify.core.stats import positive
from kbverify.core.status import Status, Warn
from kbverify.report.leaderboard import board_from_verdicts

P_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0)


def summarize(verdicts: Sequence[Verdict], *, title: str = "kbverify report", provenance: dict | None = None,
              samples: str | None = None, group_by: str | None = None) -> dict:
    """Everything the reports show, as JSON-ready data.

    `samples` (first | best) picks one sample per task for every protocol; None uses each protocol's own rule
    (KernelBench scores the first sample, KernelBench-Verified the best). `group_by`: a label whose groups get a
    leaderboard (`kbverify.report.leaderboard`) under the key `leaderboard`.
    """
    protocols = list(dict.fromkeys(v.protocol for v in verdicts))
    by_protocol = {name: [v for v in verdicts if v.protocol == name] for name in protocols}
    board = None
    if group_by is not None:
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
        evidence = failing_evidence(verdict) if not verdict.correct else {
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
    # how each verdict's submission processes were confined (Verdict.isolation; a record without it reads
    # "degraded": nothing in it shows they were)
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


def _protocol_summary(verdicts: list[Verdict], samples: str) -> dict:
    from kbverify.results.score import score_rows, select_samples

    rows = score_rows_from_verdicts(verdicts)
    verdict_of = {id(row): verdict for row, verdict in zip(rows, verdicts)}
    chosen = [verdict_of[id(row)] for row in select_samples(rows, samples)]
    table = score_rows(rows, P_VALUES, samples=samples)
    passed_speedups = [v.speedup for v in chosen if v.correct and positive(v.speedup)]
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
            statistics.fmean([v.speedup if v.correct and positive(v.speedup) else 1.0 for v in chosen])
            if chosen else None),
        "mean_claimed": _mean([v.claimed_speedup for v in chosen]),
        "n_claimed": sum(v.claimed_speedup is not None for v in chosen),
        "per_level": {level_name(level): _level_summary([v for v in chosen if v.level == level])
                      for level in levels},
    }


def _level_summary(chosen: list[Verdict]) -> dict:
    """One level's share of the table; `chosen` already holds one verdict per task."""
    from kbverify.results.score import score_rows

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
    from kbverify.results.score import score_rows, select_samples

    rows = score_rows_from_verdicts(verdicts)
    verdict_of = {id(row): verdict for row, verdict in zip(rows, verdicts)}
    chosen = [verdict_of[id(row)] for row in select_samples(rows, samples)]
    return _fast_p_rows(score_rows(rows, ps, samples=samples), chosen)


def _fast_p_rows(table, chosen: Sequence[Verdict]) -> list[dict]:
    """A score table's rows as the report shows them, with the fast_p the authors' claims imply."""
    from kbverify.core import stats

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
    measured = sorted(v.speedup for v in verdicts if v.correct and positive(v.speedup))
    claimed = sorted(v.claimed_speedup for v in verdicts if positive(v.claimed_speedup))
    return {"n": len(verdicts), "measured": measured, "claimed": claimed}


def _claimed_summary(verdicts: Sequence[Verdict]) -> dict:
    claims = {identity(v): v.claimed_speedup for v in verdicts if v.claimed_speedup is not None}
    values = list(claims.values())
    return {"n": len(values), "mean": _mean(values), "max": max(values) if values else None}


def _unverifiable(verdicts: Sequence[Verdict]) -> dict:
    rows = {}
    for verdict in verdicts:
        if verdict.status is Status.UNVERIFIABLE:
            rows.setdefault(identity(verdict), {
                "task": verdict.task, "task_name": verdict.task_name, "submission": verdict.submission,
                "claimed_speedup": verdict.claimed_speedup, "why": verdict.message})
    items = sorted(rows.values(), key=lambda r: -(r["claimed_speedup"] or 0.0))
    with_claim = [r["claimed_speedup"] for r in items if r["claimed_speedup"] is not None]
    return {"n": len(items), "n_with_claim": len(with_claim), "mean_claimed": _mean(with_claim), "items": items}


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


def _mean(values) -> float | None:
    values = [v for v in values if positive(v)]
    return statistics.fmean(values) if values else None


def level_name(level: int | None) -> str:
    return f"level{level}" if level is not None else "unknown"
