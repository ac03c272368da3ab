# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# warn: verified=weights_not_rerandomized
# why: honest, but its parameters have other names than Model's, so re-randomised weights cannot be loaded: a warning, not a failure (SPEC §2)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        gemm = nn.Linear(in_features, out_features, bias=False)  # same draw order as Model
        self.w = nn.Parameter(gemm.weight.detach().clone())
        self.b = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(x @ self.w.t()) + self.b
