"""KernelBench's published lists of broken or degenerate tasks, and how an audit agrees with them.

Nothing is downloaded: the lists are transcribed from KernelBench-Verified's exclusions, KernelBench issue #165,
robust-kbench's numeric filters and METR's removals (reference/verified_and_hacks.md)."""

from __future__ import annotations

from kbverify.audit.records import AuditReport, TaskAudit

# (level, problem id). Lists made on KernelBench v0 (robust-kbench, METR) may name problems that v0.1 changed.
PUBLISHED = {
    "KernelBench-Verified exclusions (constant output)": {(2, 23), (2, 80), (2, 83)},
    "KernelBench issue #165 (zeros pass at 1e-2)": {(1, 23), (1, 37), (1, 39), (1, 53)},
    "robust-kbench numeric filters (v0)": {(1, p) for p in (23, 37, 38, 39, 50, 94, 96, 97, 98)}
    | {(2, p) for p in (9, 13, 23, 27, 36, 41, 44, 48, 49, 58, 66, 80, 84, 88, 89, 91, 96)},
    "METR removals (v0; not all for degeneracy)": {(1, p) for p in (8, 12, 23, 37, 39, 50, 77, 90, 95, 97)}
    | {(2, p) for p in (9, 13, 23, 27, 36, 38, 41, 44, 45, 49, 58, 66, 77, 80, 83, 84, 89, 91, 93, 96)}
    | {(3, p) for p in (3, 5, 7, 11, 12, 18, 28, 32, 34, 35, 45, 46, 47)},
}


def compare_with_published(report: AuditReport) -> str:
    """Per published list, which of its tasks this audit finds degenerate; then the degenerate ones on no list."""
    by_id = {(a.level, _problem_id(a.name)): a for a in report.tasks}
    lines = [f"\n{sum(a.degenerate for a in report.tasks)} of {len(report.tasks)} tasks degenerate, "
             f"{sum(a.error is not None for a in report.tasks)} errors"]
    for title, ids in PUBLISHED.items():
        present = sorted(i for i in ids if i in by_id)
        agreed = [i for i in present if by_id[i].degenerate]
        lines.append(f"\n{title}: {len(agreed)} of {len(present)} present are degenerate here")
        for i in present:
            audit = by_id[i]
            mark = "DEGENERATE" if audit.degenerate else ("error" if audit.error else "kept")
            lines.append(f"  {audit.task:60s} {mark:10s} {audit.error or ', '.join(_main_flags(audit))}")
    listed = set().union(*PUBLISHED.values())
    extra = [a for key, a in sorted(by_id.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0))
             if a.degenerate and key not in listed]
    lines.append(f"\ndegenerate here, on no published list: {len(extra)}")
    lines += [f"  {a.task:60s} under {', '.join(a.degenerate_under)}: {', '.join(_main_flags(a))}" for a in extra]
    return "\n".join(lines)


def _main_flags(audit: TaskAudit) -> list[str]:
    return [f for f in audit.flags if not f.startswith(("trivially_passable:bf16", "trivially_passable:fp16"))]


def _problem_id(name: str) -> int | None:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None
