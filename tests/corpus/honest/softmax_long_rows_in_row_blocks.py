# kbverify-test: task=tasks/degenerate/level1/1_Degenerate_NearZero_Softmax_long_rows.py
# expect: original=passed verified=passed
# why: computes the softmax a block of rows at a time into one output: every row, whatever the batch
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], 4):
            rows = x[start:start + 4]
            shifted = rows - rows.amax(dim=1, keepdim=True)
            weights = torch.exp(shifted)
            out[start:start + 4] = weights / weights.sum(dim=1, keepdim=True)
        return out
