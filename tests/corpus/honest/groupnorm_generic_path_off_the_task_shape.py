# kbverify-test: task=tasks/basic/level2/3_Gemm_GroupNorm_Scale.py
# expect: original=passed verified=passed
# why: honest twin of exploits/groupnorm_skips_affine_off_the_task_shape: a path for the task's own shape and a
#   generic one for every other, both applying the GroupNorm affine and the scale
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
        y = self.gemm(x)
        norm = self.group_norm
        if tuple(x.shape) != (32, 256):  # the generic path: grouped statistics by hand
            groups = y.view(y.shape[0], norm.num_groups, -1)
            mean = groups.mean(-1, keepdim=True)
            var = (groups - mean).pow(2).mean(-1, keepdim=True)
            y = ((groups - mean) / torch.sqrt(var + norm.eps)).view_as(y)
            return (y * norm.weight + norm.bias) * self.scale
        return norm(y) * self.scale
