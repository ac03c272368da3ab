# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of faults/gemm_relu_bias_prepacked_weight_stale_after_load: the transposed copy forward reads is
#   made in __init__ and made again by a load_state_dict post-hook, so it always follows the weight the model holds
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._pack()
        self.register_load_state_dict_post_hook(lambda module, incompatible: module._pack())

    def _pack(self):
        self.weight_t = self.gemm.weight.detach().t().contiguous()

    def forward(self, x):
        return torch.relu(x @ self.weight_t) + self.bias
