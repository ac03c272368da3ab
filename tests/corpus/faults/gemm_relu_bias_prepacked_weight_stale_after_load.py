# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=incorrect
# why: inference-style prepacking done once in __init__ (a transposed copy forward reads instead of the
#   parameter) and never again: after a user's load_state_dict it serves the weights it was built with. Honest
#   twins: honest/gemm_relu_bias_prepacked_repacked_on_load, honest/gemm_relu_bias_packed_again_when_weight_changes
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
