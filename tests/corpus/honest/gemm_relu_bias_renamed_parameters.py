# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# warn: verified=weights_matched_by_value
# why: honest, its parameters named otherwise than Model's but drawn in the same order under the same seed: paired
#   by their equal initial values, so it receives the re-randomised weights and is checked with them
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
