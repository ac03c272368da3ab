"""The `original` protocol's baseline is timed in the evaluating worker before any candidate code exists there,
and the flags it times under never reach the candidate's evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbverify.core.protocols import ORIGINAL
from kbverify.core.status import Status
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import load_task, parse_task
from kbverify.harness.runner import CheckOptions, check

REPO = Path(__file__).resolve().parent.parent
MATMUL = REPO / "tasks" / "basic" / "level1" / "2_Square_matrix_multiplication_.py"
RELU = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"

FLAG_PROBE = '''
import torch


class ModelNew(Model):
    def forward(self, *args):
        if torch.backends.cuda.matmul.allow_tf32:
            raise RuntimeError("the baseline's TF32 flag reached the candidate")
        return super().forward(*args)
'''


def test_baseline_timed_in_the_eval_worker_without_leaking_its_flags():
    task = load_task(MATMUL)
    protocol = ORIGINAL.with_overrides(baseline_matmul_tf32=True, timing_trials=5)
    verdict = check(task, make_submission(FLAG_PROBE, id="flag_probe.py"), protocol, CheckOptions(device="cpu"))
    assert verdict.status is Status.PASSED, verdict.message
    baseline = verdict.timing["baseline"]
    assert baseline["runtime_stats"]["num_trials"] == 5 and baseline["runtime_ms"] == verdict.ref_time_ms > 0
    assert verdict.speedup == verdict.ref_time_ms / verdict.cand_time_ms


INDEPENDENT_RELU = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp_min(x, 0.0)
'''


def test_a_reference_that_cannot_be_timed_leaves_the_speedup_unverifiable():
    relu = load_task(RELU)
    # Each execution of the task counts its own calls: the baseline's 3 warm-ups and 5 trials pass the 7th call
    # and fail, the evaluation's fresh execution calls the reference 5 times and never gets there.
    source = relu.source.replace("        return torch.relu(x)", """        global CALLS
        CALLS += 1
        if CALLS > 7:
            raise RuntimeError("the reference broke")
        return torch.relu(x)""").replace("batch_size = 16", "CALLS = 0\nbatch_size = 16")
    assert source.count("CALLS") == 4
    task = parse_task(source, name=relu.name, level=relu.level, problem_id=relu.problem_id)
    verdict = check(task, make_submission(INDEPENDENT_RELU, id="relu.py"), ORIGINAL.with_overrides(timing_trials=5),
                    CheckOptions(device="cpu"))
    assert verdict.status is Status.UNVERIFIABLE, verdict.status
    assert "the reference could not be timed" in verdict.message and "the reference broke" in verdict.message
    assert verdict.speedup is None


def test_a_timeout_while_the_reference_is_timed_is_not_the_candidates():
    from kbverify.harness.runner import _died
    from kbverify.harness.sandbox import ChildOutcome

    def timed_out(phase):
        return ChildOutcome(result=None, exit_code=None, timed_out=True, last_phase=phase, output_head="",
                            output_tail="", output_bytes=0, wall_s=300.0)

    assert _died(timed_out("reference:timing"), "candidate", "cpu")[0] is Status.UNVERIFIABLE
    assert _died(timed_out("candidate:timing"), "candidate", "cpu")[0] is Status.TIMEOUT
    assert _died(timed_out("candidate:load"), "reference", "cpu")[0] is Status.TIMEOUT


def test_a_death_with_no_phase_is_ours_only_when_a_probe_worker_cannot_start_either(monkeypatch):
    """The phase record is the child's own file, which code in the child can empty: an empty record alone does
    not make a death an infrastructure error."""
    from kbverify.core.errors import InfrastructureError
    from kbverify.harness import runner
    from kbverify.harness.sandbox import ChildOutcome

    died = ChildOutcome(result=None, exit_code=3, timed_out=False, last_phase="", output_head="", output_tail="",
                        output_bytes=0, wall_s=1.0)
    assert runner._died(died, "candidate", "cpu")[0] is Status.CRASHED  # a real probe worker starts here
    assert runner._died(died, "reference", "cpu")[0] is Status.UNVERIFIABLE
    monkeypatch.setattr(runner, "_a_worker_starts_here", lambda device: False)
    with pytest.raises(InfrastructureError, match="died before it started"):
        runner._died(died, "candidate", "cpu")
