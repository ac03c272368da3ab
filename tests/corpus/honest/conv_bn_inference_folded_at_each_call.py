# kbverify-test: task=tasks/basic/level2/7_Conv2d_BatchNorm_inference_ReLU.py
# expect: original=passed verified=passed
# why: honest twin of exploits/conv_bn_inference_assumes_fresh_running_stats: folds the BatchNorm into one
#   convolution at every call, from the running statistics and affine the model holds
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        scale = self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)
        weight = self.conv.weight * scale.view(-1, 1, 1, 1)
        bias = (self.conv.bias - self.bn.running_mean) * scale + self.bn.bias
        return torch.relu(F.conv2d(x, weight, bias, padding=1))
