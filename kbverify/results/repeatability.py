"""Two runs of the same kernels, compared: how far each speedup moved, whether the move lies within the two
confidence intervals combined, and whether any kernel crossed from `faster` to `slower` (or back)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from kbverify.core.records import Verdict


@dataclass(frozen=True)
class KernelChange:
    task: str
    submission: str
    speedup_a: float
    speedup_b: float
    change: float  # speedup_b / speedup_a − 1
    combined_log_half_width: float | None  # None: one run has no interval
    within_combined_ci: bool | None
    speed_class_a: str | None
    speed_class_b: str | None

    @property
    def crossed(self) -> bool:
        return {self.speed_class_a, self.speed_class_b} == {"faster", "slower"}


@dataclass(frozen=True)
class RunComparison:
    protocol: str
    kernels: tuple[KernelChange, ...]
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    status_changed: tuple[tuple[str, str, str], ...]  # (submission, status in a, status in b)

    @property
    def median_abs_change(self) -> float | None:
        return statistics.median(abs(k.change) for k in self.kernels) if self.kernels else None

    @property
    def share_within_combined_ci(self) -> float | None:
        judged = [k.within_combined_ci for k in self.kernels if k.within_combined_ci is not None]
        return sum(judged) / len(judged) if judged else None

    @property
    def crossings(self) -> tuple[KernelChange, ...]:
        return tuple(k for k in self.kernels if k.crossed)


def _log_half_width(verdict: Verdict) -> float | None:
    if not verdict.speedup_ci or not all(v and v > 0 for v in verdict.speedup_ci):
        return None
    low, high = verdict.speedup_ci
    return math.log(high / low) / 2


def compare_runs(run_a: Sequence[Verdict], run_b: Sequence[Verdict], protocol: str) -> RunComparison:
    """Kernels are matched by task key, submission id and sample; only those correct and timed in both runs are
    compared. The combined interval adds the two half-widths on the log scale in quadrature."""
    def index(run):
        return {(v.task, v.submission, v.sample): v for v in run if v.protocol == protocol}

    a, b = index(run_a), index(run_b)
    kernels, status_changed = [], []
    for key in sorted(a.keys() & b.keys()):
        first, second = a[key], b[key]
        if first.status is not second.status:
            status_changed.append((first.submission, first.status.value, second.status.value))
        if not (first.correct and second.correct and first.speedup and second.speedup):
            continue
        widths = [_log_half_width(first), _log_half_width(second)]
        combined = math.hypot(*widths) if None not in widths else None
        distance = abs(math.log(second.speedup / first.speedup))
        kernels.append(KernelChange(
            task=first.task, submission=first.submission, speedup_a=first.speedup, speedup_b=second.speedup,
            change=second.speedup / first.speedup - 1, combined_log_half_width=combined,
            within_combined_ci=None if combined is None else distance <= combined,
            speed_class_a=first.speed_class, speed_class_b=second.speed_class))
    return RunComparison(protocol=protocol, kernels=tuple(kernels),
                         only_in_a=tuple(sorted(v.submission for k, v in a.items() if k not in b)),
                         only_in_b=tuple(sorted(v.submission for k, v in b.items() if k not in a)),
                         status_changed=tuple(status_changed))
