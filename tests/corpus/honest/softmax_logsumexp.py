# kbverify-test: task=tasks/basic/level1/3_Softmax.py
# expect: original=passed verified=passed
# why: a different but correct algorithm: normalisation in the log domain, exp((x - max) - log(sum(exp(x - max)))), accurate at every scale; the plain exp(x - logsumexp(x)) is not: at |x| ~ 1e5 the subtraction loses up to 0.004 of the exponent, and 1.4% of the wide sets fail 1e-3 (this file held that form until session 10, and its `verified` check failed now and then)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = x - x.max(dim=1, keepdim=True).values  # exact: no absolute precision lost at any scale
        return torch.exp(shifted - torch.log(torch.exp(shifted).sum(dim=1, keepdim=True)))
