"""The hang budget (SPEC §5): a forward that makes no progress for max(FLOOR_S, FACTOR × the reference's own call
time) is a `timeout`, however long the outer `--timeout` is.

LLM-written kernels hang often (a `__syncthreads` in a branch, an index that never advances), and a hang used to
cost the whole per-worker timeout (600 s for `check`, 900 s for `rescore`). Progress is what the parent sees:
every message a job sends (its phases, its batch replies). The parent's own clock enforces the budget
(kbverify.harness.sandbox), never the child: the child runs submission code, and a hung forward cannot report anything.

Only phases in which submission code runs forwards are held to it. Loading the submission, constructing
`ModelNew` and native builds (`candidate:build…`, a JIT build announced by the extension watch) keep their own
bounds: a compile takes minutes and says nothing while it runs. A submission can announce phases as it likes, so
it can dodge the budget that way; that buys it only the outer `--timeout`, which is a cost, never a verdict.

Defaults: FLOOR_S = 45 s, FACTOR = 50. A millisecond task's hang then ends 45 s after its last message (its
forward starting), within the minute SPEC §5 asks for, and a first forward that compiles without saying so
(torch.compile, Triton autotuning: tens of seconds on an H200) is not read as a hang; a reference whose call
takes 2 s gives a slow but honest kernel 100 s per forward. The factor covers a candidate up to ~15× slower than the reference per call in
a timing batch of three calls, plus the first call's one-time costs (the reference's estimate includes its own).
The reference's call time comes only from a process that ran no submission code: the judge beside the candidate
(kbverify.worker.evaluate announces `judge:<set>` when it starts a set's reference work and `judge:compare:<set>`
when that work is done), or a run of it measured earlier in the same check. Its estimate also holds the float64
and TF32 runs of the set, so it errs long. Under `original` the one job times the baseline before the submission
exists in its process (KernelBench's order); those phases, on the parent's clock, give the pace (BaselinePace), and
the job announces each correctness trial and, while timed, at least once a second, so its silence is a hang. The
verdict of a job stopped so is `timeout`, as KernelBench's own bound would give.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

FLOOR_S = 45.0
FACTOR = 50.0

# Phases in which submission code runs forwards (the verified pipeline's workers).
FORWARD_PHASES = ("candidate:run", "candidate:warmup", "candidate:timing", "timing:warmup", "timing:rounds",
                  "timing:reference", "candidate:correctness")
# Phases that keep their own bound even inside a forward phase's job: builds and loading.
EXEMPT_PHASES = ("candidate:build", "candidate:load", "candidate:construct", "reference:load")


def in_forward(phase: str) -> bool:
    return phase.startswith(FORWARD_PHASES) and not phase.startswith(EXEMPT_PHASES)


@dataclass
class ReferencePace:
    """What a process without submission code shows of the reference's speed as it runs: the longest span of one
    set's reference work seen so far, and when the span now under way began (None when none is)."""

    call_s: float | None = None
    running_since: float | None = None
    spans_s: list = field(default_factory=list)

    def observe(self, phase: str, now: float) -> None:
        if phase.startswith("judge:compare:"):
            if self.running_since is not None:
                span = now - self.running_since
                self.spans_s.append(span)
                self.call_s = max(self.call_s or 0.0, span)
            self.running_since = None
        elif phase.startswith("judge:") and phase != "judge:load":
            self.running_since = now

    def estimate_s(self, now: float) -> float:
        """The reference's call time as far as it is known: a span still under way counts as long as it has run
        (a candidate waiting for the judge to take its output is not hung)."""
        running = now - self.running_since if self.running_since is not None else 0.0
        return max(self.call_s or 0.0, running)


@dataclass
class BaselinePace:
    """The reference's speed as the `original` protocol's one job shows it before any submission code exists in it:
    its baseline (announced `reference:timing`, ended by the next phase) makes `calls` calls after `warmup_s` of
    device warm-up, so a call takes at most the span less the warm-up over `calls` (set-up included: it errs long).
    Only phases announced before the job's first candidate phase reach it (kbverify.harness.sandbox)."""

    calls: int
    warmup_s: float = 0.0
    call_s: float | None = None
    running_since: float | None = None

    def observe(self, phase: str, now: float) -> None:
        if phase.startswith("reference:timing"):
            if self.running_since is None:
                self.running_since = now
        elif self.running_since is not None:
            self.call_s = max(0.0, now - self.running_since - self.warmup_s) / max(1, self.calls)
            self.running_since = None

    def estimate_s(self, now: float) -> float:
        return self.call_s or 0.0


@dataclass(frozen=True)
class HangBudget:
    floor_s: float = FLOOR_S
    factor: float = FACTOR
    reference_call_s: float | None = None  # known before the worker starts (an earlier trusted process's)
    pace: ReferencePace | BaselinePace | None = None  # learnt while the worker runs (the judge beside it)

    def allowance_s(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        known = max(self.reference_call_s or 0.0, self.pace.estimate_s(now) if self.pace is not None else 0.0)
        return max(self.floor_s, self.factor * known)

    def stalled(self, phase: str, quiet_s: float, now: float | None = None) -> bool:
        """Whether a job whose last phase is `phase` and that has said nothing for `quiet_s` is hung."""
        if self.floor_s <= 0 or not in_forward(phase):
            return False
        return quiet_s > self.allowance_s(now)

    def describe(self, now: float | None = None) -> str:
        known = self.reference_call_s or (self.pace.estimate_s(time.monotonic() if now is None else now)
                                          if self.pace is not None else None)
        pace = f"{self.factor:g} × the reference's {known:.3g} s call" if known else "no reference call time yet"
        return f"max({self.floor_s:g} s, {pace})"
