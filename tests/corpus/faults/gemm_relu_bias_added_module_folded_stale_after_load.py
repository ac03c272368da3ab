# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=incorrect
# why: registers its linear layer with add_module and scales it in place in __init__: right for the weights it
#   is built with (they reach the layer when it is registered), wrong once a user loads Model's weights into it.
#   Honest twin: honest/gemm_relu_bias_added_module_folded_load_override
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
