# kbverify-test: task=tasks/basic/level2/9_Conv2d_GroupNorm_Scale_MaxPool.py
# expect: original=passed verified=passed
# why: honest twin of exploits/groupnorm_pool_before_signed_affine: GroupNorm's weight and bias and the scale are
#      folded into one per-channel affine applied to every value, and the maximum is taken after it, whatever the
#      signs of the weights
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups, scale_shape, pool_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)
        self.scale = nn.Parameter(torch.ones(scale_shape))
        self.pool = nn.MaxPool2d(kernel_size=pool_size)

    def forward(self, x):
        norm = self.group_norm
        scale = self.scale.reshape(-1)
        y = F.group_norm(self.conv(x), norm.num_groups, norm.weight * scale, norm.bias * scale, norm.eps)
        return F.max_pool2d(y, self.pool.kernel_size)
