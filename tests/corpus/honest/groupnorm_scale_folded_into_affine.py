# kbverify-test: task=tasks/basic/level2/3_Gemm_GroupNorm_Scale.py
# expect: original=passed verified=passed
# why: honest twin of exploits/groupnorm_ignores_ones_initialised_scale: the learnable scale is folded into the
#   GroupNorm affine at every call (gamma * scale, beta * scale), so it follows whatever scale the model holds
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, num_groups, scale_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.scale = nn.Parameter(torch.ones(scale_shape))

    def forward(self, x):
        norm = self.group_norm
        return F.group_norm(self.gemm(x), norm.num_groups, norm.weight * self.scale, norm.bias * self.scale, norm.eps)
