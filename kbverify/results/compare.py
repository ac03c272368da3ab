"""`kbverify compare A B`: two results of the same work side by side.

Two stores (`rescore` runs of the same kernels, on one machine or two) give their repeatability: one row per kernel
correct in both (speedups, change, combined-CI test, speed classes), the kernels whose status changed, and the
median |change|, the share within the combined CIs and the faster<->slower crossings (`kbverify.results.repeatability`).

Two audit reports (`audit --out`, or the KernelBench audit's JSON) of the same tasks give what changed: one line per
task, matched by key (name and content hash), whose degenerate verdict, protocols, flags or error differ, then a
summary line, so a rerun on another machine or after a change to the audit is checked in one command.

Which kind each file is comes from its content (an SQLite header, or a JSON object with a task list). The exit
code says whether the comparison found what it looks for: 1 when no kernel is correct and timed in both runs, or
when a verdict changed on a task both audits have evidence for; else 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.results.repeatability import RunComparison, compare_runs
from kbverify.results.store import Store

_SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass(frozen=True)
class Comparison:
    """What `compare` found: the text to show and the exit code it implies."""

    kind: str  # "runs" or "audits"
    text: str
    exit_code: int


def compare(path_a: Path, path_b: Path, *, protocol: str = "verified") -> Comparison:
    """Compare two stores (under `protocol`) or two audit reports; anything else is an InputError."""
    kinds = {path: _kind(path) for path in (path_a, path_b)}
    if kinds[path_a] != kinds[path_b]:
        raise InputError(f"{path_a} is {_KIND_NAMES[kinds[path_a]]} and {path_b} is {_KIND_NAMES[kinds[path_b]]}; "
                         f"compare two stores or two audit reports")
    if kinds[path_a] == "store":
        runs = []
        for path in (path_a, path_b):
            with Store(path, existing=True) as store:
                runs.append([verdict for _, verdict in store.verdicts()])
        result = compare_runs(*runs, protocol=protocol)
        return Comparison("runs", "\n".join(run_lines(result)) + "\n", 0 if result.kernels else 1)
    lines, verdict_changed = audit_changes(_audit_report(path_a), _audit_report(path_b))
    return Comparison("audits", "\n".join(lines) + "\n", 1 if verdict_changed else 0)


_KIND_NAMES = {"store": "a store", "audit": "an audit report"}


def _kind(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path}: no such file (give two stores or two audit reports)")
    with open(path, "rb") as handle:
        if handle.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER:
            return "store"
    _audit_report(path)
    return "audit"


def _audit_report(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: neither a store nor an audit report ({type(error).__name__}: {error})") from None
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(task, dict) and "key" in task for task in tasks):
        raise InputError(f"{path}: neither a store nor an audit report (no list of tasks with keys)")
    return data


def run_lines(result: RunComparison) -> list[str]:
    """The repeatability of two runs as a Markdown table, the status changes and a summary line."""
    lines = ["| submission | speedup A | speedup B | change | within combined CI | class A | class B |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {k.submission} | {k.speedup_a:.3f} | {k.speedup_b:.3f} | {k.change:+.2%} | {k.within_combined_ci} "
              f"| {k.speed_class_a} | {k.speed_class_b} |" for k in result.kernels]
    lines += [f"status changed: {submission}: {before} -> {after}"
              for submission, before, after in result.status_changed]
    if result.only_in_a or result.only_in_b:
        lines.append(f"only in A: {len(result.only_in_a)}, only in B: {len(result.only_in_b)}")
    if not result.kernels:
        return [*lines, "no kernel is correct and timed in both runs"]
    share = result.share_within_combined_ci
    lines.append(f"{len(result.kernels)} kernels: median |change| {result.median_abs_change:.2%}; within the combined "
                 f"95% CIs: {'-' if share is None else f'{share:.0%}'}; faster<->slower crossings: "
                 f"{len(result.crossings)}")
    return lines


def audit_changes(old: dict, new: dict) -> tuple[list[str], bool]:
    """(one line per task that changed, then a summary line; whether a degenerate verdict changed)."""
    before = {task["key"]: task for task in old["tasks"]}
    after = {task["key"]: task for task in new["tasks"]}
    lines, verdicts_changed = [], 0
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only in the {'new' if a is None else 'old'} report")
            continue
        if a.get("error") or b.get("error"):
            if bool(a.get("error")) != bool(b.get("error")):
                lines.append(f"{key}: error {'gone' if a.get('error') else 'new'}: "
                             f"{(a.get('error') or b.get('error'))[:120]}")
            continue
        line, verdict = _task_change(a, b)
        verdicts_changed += verdict
        if line:
            lines.append(f"{key}: {line}")
    both = [k for k in before.keys() & after.keys() if not before[k].get("error") and not after[k].get("error")]
    lines.append(f"{len(both)} tasks with evidence in both; {verdicts_changed} verdicts changed, "
                 f"{len(lines)} tasks listed")
    return lines, verdicts_changed > 0


def _task_change(a: dict, b: dict) -> tuple[str, bool]:
    """What changed on one task audited in both reports, and whether its verdict did."""
    verdict = (a.get("degenerate"), a.get("degenerate_under")) != (b.get("degenerate"), b.get("degenerate_under"))
    flags_a, flags_b = set(a.get("flags") or ()), set(b.get("flags") or ())
    gained, lost = sorted(flags_b - flags_a), sorted(flags_a - flags_b)
    parts = (f"degenerate {a.get('degenerate_under')} -> {b.get('degenerate_under')}" if verdict else "",
             f"+{', +'.join(gained)}" if gained else "", f"-{', -'.join(lost)}" if lost else "")
    return "; ".join(part for part in parts if part), verdict
