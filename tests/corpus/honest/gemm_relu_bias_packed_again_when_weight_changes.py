# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of exploits/gemm_relu_bias_packs_at_first_call_only: packs its transposed weight at a call and
#   keeps it while the weight is unchanged (same storage, same version counter, which every in-place write and
#   load_state_dict's copy moves), so weights loaded later are packed again
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.packed, self.packed_from = None, None

    def forward(self, x):
        weight = self.gemm.weight
        key = (weight.data_ptr(), weight._version)
        if self.packed_from != key:
            self.packed, self.packed_from = weight.detach().t().contiguous(), key
        return torch.relu(x @ self.packed) + self.bias
