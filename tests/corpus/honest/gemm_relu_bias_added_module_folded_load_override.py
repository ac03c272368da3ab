# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of faults/gemm_relu_bias_added_module_folded_stale_after_load: registers its linear layer with
#   add_module and scales it in place in __init__, and overrides load_state_dict and state_dict so that what is
#   loaded is scaled the same way and what is saved means Model's weights
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.add_module("gemm", nn.Linear(in_features, out_features, bias=False))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        with torch.no_grad():
            self.gemm.weight.mul_(2.0)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        state_dict = dict(state_dict)
        if "gemm.weight" in state_dict:
            state_dict["gemm.weight"] = state_dict["gemm.weight"] * 2.0
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def state_dict(self, *args, **kwargs):
        saved = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        if prefix + "gemm.weight" in saved:
            saved[prefix + "gemm.weight"] = saved[prefix + "gemm.weight"] * 0.5
        return saved

    def forward(self, x):
        return torch.relu(self.gemm(x)) * 0.5 + self.bias
