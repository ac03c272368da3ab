# kbverify-test: task=tasks/basic/level2/5_Conv2d_BatchNorm_ReLU.py
# expect: original=passed verified=passed
# why: turns oneDNN off inside its own forward only (torch's flags context, restored on the way out): it slows
#      nobody but itself, so the baseline flags guard must not call it tampering
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        with torch.backends.mkldnn.flags(enabled=False):
            return torch.relu(self.bn(self.conv(x)))
