# kbverify-test: task=tasks/basic/level2/5_Conv2d_BatchNorm_ReLU.py
# expect: original=passed verified=passed
# why: writes torch.backends.mkldnn.enabled = True at import (its default, so nothing changes) and checks that
#      oneDNN is there: touching the flag is not tampering, changing it for the baseline is
import torch
import torch.nn as nn

torch.backends.mkldnn.enabled = True
ONEDNN = torch.backends.mkldnn.is_available()


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))
