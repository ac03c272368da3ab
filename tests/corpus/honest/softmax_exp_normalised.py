# kbverify-test: task=tasks/basic/level1/3_Softmax.py
# expect: original=passed verified=passed
# why: softmax written out (max subtracted, exp, divided by the row sum); stable for shifted and wide inputs
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = x - x.amax(dim=1, keepdim=True)
        weights = torch.exp(shifted)
        return weights / weights.sum(dim=1, keepdim=True)
