# kbverify-test: task=tasks/basic/level1/14_Softmax_signed_short_rows.py
# expect: original=passed verified=passed
# why: max-subtracted exp / sum, written out; correct for signed, scaled and shifted rows
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)
