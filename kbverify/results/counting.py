"""How verdicts are counted, one rule for every table that counts them: which speedups count in fast_p
(`score_rows_from_verdicts`), which sample a protocol scores (`samples_rule`), and what changed between protocols
(`status_changes`). The report summary (`kbverify.report.summary`) and the leaderboards (`kbverify.report.leaderboard`) both
import it, so a report, a leaderboard and `kbverify score` of the same verdicts agree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from kbverify.core.protocols import PRESETS
from kbverify.core.records import Verdict, task_label
from kbverify.core.status import Warn


def score_rows_from_verdicts(verdicts: Sequence[Verdict]) -> list:
    """One `kbverify.results.score.ScoreRow` per verdict; a task is `level<L>/<name>`, or its name when the level is unknown."""
    from kbverify.results.score import ScoreRow  # deferred: scipy is only needed when something is scored

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


def status_changes(verdicts: Sequence[Verdict], protocols: Sequence[str] | None = None) -> list[dict]:
    """Every (task, submission) whose status differs between consecutive protocols, with the evidence."""
    protocols = list(protocols or dict.fromkeys(v.protocol for v in verdicts))
    by_identity: dict[tuple, dict[str, Verdict]] = defaultdict(dict)
    for verdict in verdicts:
        by_identity[identity(verdict)].setdefault(verdict.protocol, verdict)
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
                "evidence": failing_evidence(failing),
                "claimed_speedup": after.claimed_speedup,
                "from_speedup": before.speedup, "to_speedup": after.speedup,
            })
    return sorted(changes, key=lambda c: (c["from_protocol"], c["to_protocol"], c["change"], c["level"] or 0,
                                          c["problem_id"] or 0, c["task_name"], c["submission"]))


def failing_evidence(verdict: Verdict) -> dict:
    """The input set that decided a failing verdict, else its message."""
    candidates = [s for s in verdict.sets if s.status is verdict.status] or \
                 [s for s in verdict.sets if s.valid and not s.status.passed]
    if candidates:
        first = candidates[0]
        detail = first.detail or verdict.message
        return {"protocol": verdict.protocol, "set_id": first.set_id, "detail": detail or "no detail recorded"}
    return {"protocol": verdict.protocol, "set_id": None, "detail": verdict.message or "no detail recorded"}


def identity(verdict: Verdict) -> tuple:
    return (verdict.task, verdict.submission, verdict.sample)
