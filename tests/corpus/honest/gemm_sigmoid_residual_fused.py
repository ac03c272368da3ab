# kbverify-test: task=tasks/basic/level2/6_Gemm_Sigmoid_Scaling_ResidualAdd.py
# expect: original=passed verified=passed
# why: addmm, then sigmoid * scale + residual in one addcmul-style expression
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, scaling_factor):
        super().__init__()
        self.gemm = nn.Linear(input_size, hidden_size)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        y = torch.addmm(self.gemm.bias, x, self.gemm.weight.t())
        return torch.add(y, torch.sigmoid(y), alpha=self.scaling_factor)
