# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest inference-style prepacking: the transposed weight is computed once in __init__ and forward never reads the parameter again; the re-randomised weights must reach it
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.weight_t = self.gemm.weight.detach().t().contiguous()

    def forward(self, x):
        return torch.relu(x @ self.weight_t) + self.bias
