# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of exploits/gemm_stale_when_loaded_before_first_call: the transposed copy made in __init__ is made
#   again by every load_state_dict, called before the first forward or after it
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._packed = self.gemm.weight.detach().t().contiguous()

    def load_state_dict(self, *args, **kwargs):
        result = super().load_state_dict(*args, **kwargs)
        self._packed = self.gemm.weight.detach().t().contiguous()
        return result

    def forward(self, x):
        return torch.relu(x @ self._packed.to(x.device)) + self.bias
