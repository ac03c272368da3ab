# kbverify-test: task=tasks/basic/level1/3_Softmax.py
# expect: original=passed verified=passed
# why: a different but correct algorithm: exp(x - logsumexp(x)), stable for every scale and sign
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x - torch.logsumexp(x, dim=1, keepdim=True))
