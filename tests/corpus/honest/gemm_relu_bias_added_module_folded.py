# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: registers its linear layer with add_module (not by assignment) and then scales it in place: relu(2z)/2 =
#   relu(z), right for any weights, which must reach the layer when it is registered, before the fold
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.add_module("gemm", nn.Linear(in_features, out_features, bias=False))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        with torch.no_grad():
            self.gemm.weight.mul_(2.0)

    def forward(self, x):
        return torch.relu(self.gemm(x)) * 0.5 + self.bias
