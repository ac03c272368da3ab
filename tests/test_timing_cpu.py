"""The interleaved timing pipeline on the CPU: a known 2× case comes out as 2×, an A/A case as 1×."""

import pytest

from kbverify.protocols import VERIFIED
from kbverify.runner import CheckOptions, check
from kbverify.submissions import make_submission
from kbverify.tasks import parse_task

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, a, b):
        return torch.tanh(a @ b)

N = 192

def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]

def get_init_inputs():
    return []
"""

TWICE = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, a, b):
        first = torch.tanh(a @ b)
        torch.tanh(a @ b)  # the same work again, thrown away: exactly twice the reference's
        return first
"""

SAME = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, a, b):
        return torch.tanh(a @ b)
"""

PROTOCOL = VERIFIED.with_overrides(timing_budget_s=1.5, hidden_shapes=False, distributions=("x1",),
                                   rerandomized_weights=False)


def _speed(source: str):
    task = parse_task(TASK, name="1_TanhMatmul", level=1, problem_id=1)
    verdict = check(task, make_submission(source, id="s.py"), PROTOCOL, CheckOptions(device="cpu", timeout_s=120))
    assert verdict.status.value == "passed", verdict.message
    return verdict


@pytest.mark.slow
def test_doing_the_work_twice_measures_as_half_the_speed():
    verdict = _speed(TWICE)
    low, high = verdict.speedup_ci
    assert low <= verdict.speedup <= high
    assert 0.45 < verdict.speedup < 0.55, verdict.speedup
    assert verdict.speed_class == "slower"


@pytest.mark.slow
def test_the_same_work_measures_as_the_same_speed():
    verdict = _speed(SAME)
    assert 0.85 < verdict.speedup < 1.15, verdict.speedup
    assert verdict.speed_class in ("same", "ambiguous")
