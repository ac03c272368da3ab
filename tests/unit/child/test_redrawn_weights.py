"""Re-randomised weights (`kbverify.worker.evaluate.rerandomized_state`): parameters and affine buffers take both
signs, statistics buffers keep their domain, and a module defined only for positive weights makes its set
invalid, with the reference's failure as the evidence. Corpus: exploits/groupnorm_pool_before_signed_affine."""

import torch
import torch.nn as nn
from hypothesis import given, settings, strategies as st

from kbverify.worker.evaluate import build_reference, judge_call, rerandomized_state


class _Affine(nn.Module):
    def __init__(self, channels: int, fill: float):
        super().__init__()
        self.norm = nn.GroupNorm(1, channels)
        self.bn = nn.BatchNorm1d(channels)
        self.scale = nn.Parameter(torch.full((channels,), fill))
        self.register_buffer("gain", torch.full((channels,), fill + 1.0))  # an affine buffer, not a statistic


@settings(max_examples=30, deadline=None)
@given(channels=st.integers(8, 64), fill=st.floats(0.01, 100.0), seed=st.integers(0, 2**31 - 1))
def test_redrawn_weights_take_both_signs(channels, fill, seed):
    state = rerandomized_state(_Affine(channels, fill), seed)
    for name in ("norm.weight", "scale", "gain"):
        assert bool((state[name] < 0).any()) and bool((state[name] > 0).any()), name
    assert bool((state["bn.running_var"] > 0).all())  # a variance stays a variance
    assert state["bn.num_batches_tracked"].dtype == torch.long


def _log_scale_namespace() -> dict:
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(64))

        def forward(self, x):
            return x * torch.log(self.scale)

    return {"Model": Model, "get_init_inputs": lambda: []}


def test_a_module_defined_for_positive_weights_only_makes_its_set_invalid():
    cpu = torch.device("cpu")
    model = build_reference(_log_scale_namespace(), 7, "rerandomized", cpu, True)[0]
    entry = judge_call(model, [torch.rand(4, 64)], 0, cpu, (False, False), False, False, lambda ref: None,
                       phase="test")
    assert entry == {"valid": False, "invalid_reason": "reference output is not finite"}
