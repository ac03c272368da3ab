# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: nn.Linear's own idiom: the parameter is assigned empty and initialised afterwards in reset_parameters();
#   that replaces what was handed over at the assignment without depending on it, so the weights checked with
#   must be loaded again (while a value derived from the handed-over one, as a fold, must not be)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.empty(bias_shape))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.bias)

    def forward(self, x):
        return torch.relu(x @ self.gemm.weight.t()) + self.bias
