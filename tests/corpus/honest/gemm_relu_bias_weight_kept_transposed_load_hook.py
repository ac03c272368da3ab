# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: keeps its weight transposed as a parameter of its own name and shape (in_features x out_features), which
#   pairs with Model's neither by name nor by value; its _load_from_state_dict transposes Model's gemm.weight into
#   it, so the re-randomised weights reach it through load_state_dict under Model's names
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        drawn = nn.Linear(in_features, out_features, bias=False)  # Model's draw, so its default weights are Model's
        self.weight_t = nn.Parameter(drawn.weight.detach().t().contiguous())
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "gemm.weight" in state_dict:  # Model's layout (the dict is load_state_dict's own copy)
            state_dict[prefix + "weight_t"] = state_dict.pop(prefix + "gemm.weight").t().contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x):
        return torch.relu(x @ self.weight_t) + self.bias
