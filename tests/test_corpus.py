"""Every submission of the corpus gets the verdict its header promises, under `original` and `verified` (CPU).

Exploits must pass `original` (that is what makes them exploits of KernelBench's protocol) and be caught by
`verified`; honest submissions must pass `verified` (no false positives); faults get the right status.
"""

import dataclasses

import pytest

from corpus_cases import CAUGHT_BY_ORIGINAL_TOO, all_cases
from kbverify.core.protocols import ORIGINAL, VERIFIED
from kbverify.core.submissions import load_submission
from kbverify.core.tasks import load_task
from kbverify.harness.runner import CheckOptions, check

# A short timing budget: the statistics need not be tight for a verdict on correctness and guards.
PROTOCOLS = {"original": ORIGINAL, "verified": VERIFIED.with_overrides(timing_budget_s=0.3)}
CASES = all_cases("honest") + all_cases("exploits") + all_cases("faults")
# An open bypass fails its test until its defence exists; strict, so the day it is caught the suite says so
# (then drop its `# open:` line and add an honest case beside it).
# A case whose verdict rests on a measured speed (a bound on it, or a budget for it) runs in the serial part of
# the suite, alone on the machine; the others run two at a time (.ci/run).


def _marks(case) -> list:
    marks = [pytest.mark.serial] if case.max_speedup or case.budget_s else []
    if case.open:
        marks.append(pytest.mark.xfail(strict=True, reason="open: " + case.open))
    return marks


PARAMS = [pytest.param(case, marks=_marks(case)) for case in CASES]
OPTIONS = CheckOptions(device="cpu", timeout_s=120.0)  # room for a first C++ build on a busy 2-core machine
FAULT_OPTIONS = CheckOptions(device="cpu", timeout_s=15.0)  # the hang is killed at this deadline


@pytest.mark.slow
@pytest.mark.parametrize("case", PARAMS, ids=lambda c: c.id)
def test_corpus_verdicts(case):
    task, submission = load_task(case.task), load_submission(case.path)
    for name, protocol in PROTOCOLS.items():
        if name in case.budget_s:
            protocol = protocol.with_overrides(timing_budget_s=case.budget_s[name])
        elif name == "verified" and not case.max_speedup:
            # no speed is judged here: the 0.2 s that brings a GPU's clocks up before the warm-up calls is only
            # cost (twice a check: beside the candidate and in the clean process)
            protocol = protocol.with_overrides(device_warmup_s=0.0)
        if name == "verified" and not case.as_user:
            # the set run as a user calls the model costs an interpreter that imports torch (~3.5 s on a CPU);
            # only the cases about it (`# as-user: on`, tests/corpus_cases.py) run it
            protocol = protocol.with_overrides(as_user_set=False)
        options = FAULT_OPTIONS if case.path.parent.name == "faults" else OPTIONS
        if name in case.secret:
            options = dataclasses.replace(options, secret=case.secret[name])
        verdict = check(task, submission, protocol, options)
        allowed = case.expect[name].split("|")
        # the run's secret picks every seed: with it, a failure here can be reproduced and examined
        assert verdict.status.value in allowed, \
            f"{name}: {verdict.status.value} ({verdict.message[:300]}; secret {verdict.reproducer.get('secret')})"
        for warning in case.warn.get(name, "").split(","):
            if warning:
                assert warning in verdict.warnings, f"{name}: missing warning {warning}: {verdict.warnings}"
        if name in case.max_speedup:
            assert verdict.speedup is not None and verdict.speedup <= case.max_speedup[name], \
                f"{name}: speedup {verdict.speedup} over {case.max_speedup[name]}"
        if verdict.correct and protocol.isolated:
            assert verdict.speedup is not None and verdict.speedup_ci is not None
            assert verdict.speedup_ci[0] <= verdict.speedup <= verdict.speedup_ci[1]
        if not verdict.correct and verdict.sets:
            assert verdict.reproducer.get("set") or verdict.status.value.startswith("exploit:") \
                or verdict.status.value in ("compile_error", "timeout", "crashed") \
                or verdict.message.startswith("while timed")  # timed calls are no input set


def test_no_fewer_honest_submissions_than_exploits():
    """A guard is only as good as the honest kernels it lets through: the corpus keeps at least one of those for
    every cheat caught, and every exploit is expected to pass `original` (else it exploits nothing). Open bypasses
    (`# open:`) have no guard yet, so no honest twin either."""
    honest, exploits = all_cases("honest"), all_cases("exploits")
    caught = [case for case in exploits if not case.open]
    assert len(honest) >= len(caught), (len(honest), len(caught))
    assert all(case.expect["verified"] == "passed" for case in honest)
    assert all(case.expect["original"] == "passed" for case in exploits
               if case.path.stem not in CAUGHT_BY_ORIGINAL_TOO)
