# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: GEMM, ReLU and bias fused into one expression over the same parameters
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(torch.mm(x, self.gemm.weight.t())).add_(self.bias)
