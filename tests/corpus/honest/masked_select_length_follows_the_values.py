# kbverify-test: task=tests/corpus/tasks/masked_select_above_half.py
# expect: original=passed verified=passed
# why: torch.masked_select, whose output's length follows the input's values: every timed call's output has another shape than the reference's on the first draw, and the timed-output check compares types and dtypes structurally and leaves shapes to the comparison on the call's own inputs
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.masked_select(x, x > 0.5)
