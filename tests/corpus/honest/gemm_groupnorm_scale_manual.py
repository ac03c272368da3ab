# kbverify-test: task=tasks/basic/level2/3_Gemm_GroupNorm_Scale.py
# expect: original=passed verified=passed
# why: group norm by hand with two-pass variance; uses the GroupNorm affine and the scale (re-randomised weights agree)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, num_groups, scale_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.scale = nn.Parameter(torch.ones(scale_shape))

    def forward(self, x):
        y = torch.addmm(self.gemm.bias, x, self.gemm.weight.t())
        n, c = y.shape
        g = self.group_norm.num_groups
        grouped = y.reshape(n, g, c // g)
        mean = grouped.mean(dim=2, keepdim=True)
        centered = grouped - mean
        var = (centered * centered).mean(dim=2, keepdim=True)
        normed = (centered * torch.rsqrt(var + self.group_norm.eps)).reshape(n, c)
        return (normed * self.group_norm.weight + self.group_norm.bias) * self.scale
