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


def _bare_cover():
    from kbverify.timing import _Cover

    cover = object.__new__(_Cover)  # no device to calibrate against on the CPU: the length rule alone
    cover.recent_ms, cover.cycles_per_ms = [], 1.0
    return cover


def test_the_hold_follows_the_slowest_recent_host_work_within_its_floor_and_cap():
    cover = _bare_cover()
    assert cover.length_ms == cover.FLOOR_MS
    assert cover.observe(0.2) == 1  # longer than the floor-length hold it had
    assert cover.length_ms == pytest.approx(cover.MARGIN * 0.2)
    assert cover.observe(0.1) == 0
    assert cover.length_ms == pytest.approx(cover.MARGIN * 0.2)
    cover.observe(1e6)
    assert cover.length_ms == cover.CAP_MS
    for _ in range(cover.WINDOW):
        cover.observe(0.01)
    assert cover.length_ms == cover.FLOOR_MS  # one slow call is forgotten after a window of calls


def test_each_call_gets_its_own_tensors_or_the_previous_calls_refilled():
    import torch

    from kbverify.timing import _Side

    side = _Side("cand", torch.nn.Identity(), {}, torch.device("cpu"), "secret", grad=False)
    seen_fresh = seen_refilled = False
    for call in range(40):
        staged = [torch.full((4, 3), float(call)), 7, [torch.full((2,), float(call))]]
        placed = side.place(staged)
        assert placed[0] is not staged[0] and torch.equal(placed[0], staged[0]) and placed[1] == 7
        assert placed[2] is staged[2]  # a nested value is this call's draw, never the last call's
        if call and placed[0] is previous:
            seen_refilled = True
        elif call:
            seen_fresh = True
        previous = placed[0]
    assert seen_fresh and seen_refilled


def test_poison_spares_a_tensor_the_model_owns_and_fills_the_rest():
    import torch

    from kbverify.timing import _own_storages, _poison

    model = torch.nn.Linear(3, 2)
    fresh = torch.ones(2, 2)
    _poison([model.weight.detach()[0], fresh], _own_storages(model))
    assert torch.isfinite(model.weight).all()
    assert torch.isnan(fresh).all()
