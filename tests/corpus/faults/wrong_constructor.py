# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=runtime_error verified=runtime_error
# why: ModelNew takes two constructor arguments where Model takes three, so ModelNew(*get_init_inputs()) raises TypeError
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x):
        return torch.relu(self.gemm(x))
