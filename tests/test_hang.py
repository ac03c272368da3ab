"""The hang budget (kbverify.harness.hang): a forward with no progress for max(N s, k × the reference's own call time) is a
`timeout`, enforced by the parent's clock in the correctness phase and in the timing worker; builds and loading
keep their own bound; an honest forward that is slow once, within k × the reference's pace, is not a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kbverify.core.protocols import ORIGINAL, VERIFIED
from kbverify.core.status import Status
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import parse_task
from kbverify.harness import hang
from kbverify.harness.runner import CheckOptions, check

pytestmark = pytest.mark.serial  # it bounds how long a hang takes to end: alone on the machine (.ci/run)


# ---- the rule ------------------------------------------------------------------------------------------------

def test_the_budget_is_the_floor_or_k_times_the_references_call():
    assert hang.HangBudget(20.0, 50.0).allowance_s(0.0) == 20.0  # nothing known of the reference: the floor
    assert hang.HangBudget(20.0, 50.0, reference_call_s=0.001).allowance_s(0.0) == 20.0  # a millisecond task
    assert hang.HangBudget(20.0, 50.0, reference_call_s=2.0).allowance_s(0.0) == 100.0
    # the defaults end a millisecond task's hang well within a minute of its forward starting
    assert hang.HangBudget(reference_call_s=0.001).allowance_s(0.0) < 60 - 5


def test_only_forward_phases_are_held_to_it():
    budget = hang.HangBudget(1.0, 50.0)
    for phase in ("candidate:run:original/x1/default/s0", "candidate:timing", "candidate:warmup", "timing:rounds",
                  "timing:reference", "timing:reference-warmup", "timing:warmup"):
        assert budget.stalled(phase, 1.5, 0.0), phase
        assert not budget.stalled(phase, 0.5, 0.0), phase
    for phase in ("candidate:load", "candidate:build", "candidate:build:inline", "candidate:construct:x",
                  "reference:load", "judge:original/x1/default/s0", ""):
        assert not budget.stalled(phase, 1e6, 0.0), phase
    assert not hang.HangBudget(0.0, 50.0).stalled("candidate:timing", 1e6, 0.0)  # a floor of 0: --timeout only


def test_the_judges_phases_give_the_references_pace_and_a_span_under_way_counts():
    pace = hang.ReferencePace()
    budget = hang.HangBudget(1.0, 10.0, pace=pace)
    pace.observe("judge:load", 0.0)
    pace.observe("judge:original/x1/default/s0", 1.0)
    assert budget.allowance_s(1.5) == 5.0  # 0.5 s of reference work so far, and still running
    pace.observe("judge:compare:original/x1/default/s0", 1.3)
    assert pace.call_s == pytest.approx(0.3)
    assert budget.allowance_s(100.0) == pytest.approx(3.0)  # the judge waits on the candidate: not its pace
    pace.observe("judge:original/x3/default/s0", 100.0)
    pace.observe("judge:compare:original/x3/default/s0", 100.1)
    assert pace.call_s == pytest.approx(0.3)  # the longest span


def test_the_original_protocols_baseline_gives_the_references_pace():
    pace = hang.BaselinePace(calls=103, warmup_s=0.2)
    budget = hang.HangBudget(1.0, 50.0, pace=pace)
    pace.observe("reference:timing", 10.0)
    pace.observe("reference:timing", 11.0)  # announced again while it runs: the same span
    assert budget.allowance_s(12.0) == 1.0  # nothing known until the baseline ends
    pace.observe("reference:load", 20.5)
    assert pace.call_s == pytest.approx(0.1)  # (10.5 s - 0.2 s of warm-up) / 103 calls
    assert budget.allowance_s(100.0) == pytest.approx(5.0)
    assert budget.stalled("candidate:correctness:0", 6.0, 100.0)
    assert not budget.stalled("candidate:load", 1e6, 100.0)  # exec and construction keep their own bound


# ---- on the CPU, through the sandbox -------------------------------------------------------------------------

TASK = '''
import time

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        time.sleep(0.05)  # a reference whose call takes 50 ms: the budget is k times that, not just the floor
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

HANGS = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
'''

HANGS_WHEN_TIMED = '''
import sys

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "_serve_batches":  # the timed rounds, after a clean warm-up
                while True:
                    pass
            frame = frame.f_back
        return torch.relu(x)
'''

SLOW_ONCE = '''
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ready = False

    def forward(self, x):
        if not self.ready:  # a lazy first-call set-up: quiet longer than the floor, within k x the reference
            time.sleep(2.0)
            self.ready = True
        time.sleep(0.05)
        return torch.relu(x)
'''

PROTOCOL = VERIFIED.with_overrides(timing_budget_s=0.5, hidden_shapes=False, distributions=("x1", "neg"),
                                   rerandomized_weights=False)
OUTER_S = 120.0
OPTIONS = CheckOptions(device="cpu", timeout_s=OUTER_S, hang_floor_s=1.0, hang_factor=50.0)


def _check(source: str, options: CheckOptions = OPTIONS, protocol=PROTOCOL):
    task = parse_task(TASK, name="1_SlowReLU", level=1, problem_id=1)
    started = time.monotonic()
    verdict = check(task, make_submission(source, id="s.py"), protocol, options)
    return verdict, time.monotonic() - started


@pytest.mark.slow
def test_a_forward_that_hangs_in_the_correctness_sets_ends_as_a_timeout_in_seconds():
    verdict, took = _check(HANGS)
    assert verdict.status is Status.TIMEOUT, verdict.message
    assert "no progress" in verdict.message and "candidate:run" in verdict.message, verdict.message
    assert took < 40, took  # the outer bound is 120 s; the budget here is max(1 s, 50 x ~0.1 s of reference work)


@pytest.mark.slow
def test_a_forward_that_hangs_only_when_timed_ends_as_a_timeout_in_seconds():
    verdict, took = _check(HANGS_WHEN_TIMED)
    assert verdict.status is Status.TIMEOUT, verdict.message
    assert verdict.message.startswith("while timed") and "no progress" in verdict.message, verdict.message
    assert took < 60, took


@pytest.mark.slow
def test_an_honest_forward_slow_once_within_k_times_the_references_pace_passes():
    verdict, _ = _check(SLOW_ONCE, CheckOptions(device="cpu", timeout_s=OUTER_S, hang_floor_s=1.0,
                                                hang_factor=50.0, measure_speed=False))
    assert verdict.status is Status.PASSED, verdict.message
    # the same forward against the floor alone (a factor of 0) is held to 1 s, and its 2 s set-up is a hang
    strict, _ = _check(SLOW_ONCE, CheckOptions(device="cpu", timeout_s=OUTER_S, hang_floor_s=1.0, hang_factor=0.0,
                                               measure_speed=False))
    assert strict.status is Status.TIMEOUT and "no progress" in strict.message, strict.message


@pytest.mark.slow
def test_original_ends_a_hang_within_the_hang_budget_not_the_outer_timeout():
    source = (Path(__file__).resolve().parent / "corpus" / "faults" / "infinite_loop.py").read_text()
    verdict, took = _check(source, protocol=ORIGINAL)
    assert verdict.status is Status.TIMEOUT, verdict.message  # as KernelBench's own bound would say
    assert "no progress" in verdict.message and "candidate:correctness" in verdict.message, verdict.message
    assert took < 40, took  # the outer bound is 120 s; the budget max(1 s, 50 x the baseline's ~0.05 s call)


@pytest.mark.slow
def test_original_times_an_honest_forward_slow_once_within_the_budget():
    verdict, _ = _check(SLOW_ONCE, protocol=ORIGINAL)
    assert verdict.status is Status.PASSED, verdict.message
    assert verdict.cand_time_ms is not None and verdict.cand_time_ms > 40  # its 100 timed calls ran, heard from


class _ReplyArrivesDuringTheStallCheck:
    """A worker channel whose awaited reply is read in by the stall check's own read, as happens when it arrives
    between the parent's look at its replies and that check."""

    def __init__(self):
        self.messages = type("Messages", (), {"replies": []})()
        self.waited_s = 0.0

    def stalled(self) -> bool:
        self.messages.replies.append({"op": "prepared"})
        return False

    def read(self, timeout_s: float) -> bool:
        self.waited_s += timeout_s
        time.sleep(timeout_s)
        return True


def test_a_reply_read_in_by_the_stall_check_is_taken_without_waiting_for_another():
    from kbverify.timing import timing_control

    child = _ReplyArrivesDuringTheStallCheck()
    started = time.monotonic()
    reply = timing_control._reply(child, "prepared", deadline=started + 10.0)
    assert reply == {"op": "prepared"} and child.messages.replies == []
    assert child.waited_s == 0.0 and time.monotonic() - started < 0.5
