# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=runtime_error
# why: its parameters are Model's by name, but once it has run (as if it had captured its weights into a graph at
#   its first call) its load_state_dict raises: a drop-in replacement a user cannot load trained weights into; the
#   candidate's own code raised on weights laid out as its own, so the load_state_dict sets are runtime_error
#   (weights_load_refused), not an error of kbverify's
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.captured = False

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if self.captured:
            raise RuntimeError("weights are captured at the first call and cannot be replaced")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, x):
        self.captured = True
        return torch.relu(self.gemm(x)) + self.bias
