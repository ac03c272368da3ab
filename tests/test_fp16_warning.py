"""Where the wide-range set is invalid for a task (the reference overflows), an fp16 path cannot be told from a
TF32-accurate one: it passes, flagged `fp16_path` (SPEC §2)."""

import pytest

from kbverify.core.protocols import VERIFIED
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import parse_task
from kbverify.harness.runner import CheckOptions, check

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.exp(x) / (1 + torch.exp(x))  # overflows (inf/inf) where sigmoid would not

batch_size = 16
dim = 256

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
"""

FP16 = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.sigmoid(x.half()).float()
"""

FP32 = FP16.replace("torch.sigmoid(x.half()).float()", "torch.exp(x) / (1 + torch.exp(x))")


@pytest.mark.slow
@pytest.mark.parametrize("source, flagged", [(FP16, True), (FP32, False)], ids=["fp16", "fp32"])
def test_fp16_is_flagged_where_the_wide_set_cannot_judge_it(source, flagged):
    task = parse_task(TASK, name="1_NaiveSigmoid", level=1, problem_id=1)
    protocol = VERIFIED.with_overrides(timing_budget_s=0.2, as_user_set=False)
    verdict = check(task, make_submission(source, id="sigmoid.py"), protocol, CheckOptions(device="cpu", timeout_s=60))
    assert verdict.status.value == "passed", verdict.message
    wide = [s for s in verdict.sets if s.distribution == "wide"]
    assert wide and not any(s.valid for s in wide), "the reference must overflow on the wide set"
    assert ("fp16_path" in verdict.warnings) is flagged
