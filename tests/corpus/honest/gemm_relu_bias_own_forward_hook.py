# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: applies the ReLU in a forward hook on its own submodule: a hook on a module it owns is its own business,
#   unlike one in torch's process-wide registries (which would also run inside the reference)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.gemm.register_forward_hook(lambda module, args, output: torch.relu(output))

    def forward(self, x):
        return self.gemm(x) + self.bias
