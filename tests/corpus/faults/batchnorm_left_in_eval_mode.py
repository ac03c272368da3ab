# kbverify-test: task=tasks/basic/level2/5_Conv2d_BatchNorm_ReLU.py
# expect: original=incorrect verified=incorrect
# why: puts its BatchNorm in eval mode in __init__ (running statistics, cheaper) while the task runs in training
#   mode (batch statistics): wrong, and KernelBench says so; a verifier that switches every submodule back to the
#   protocol's mode would hide it (a published level-3 kernel does exactly this)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)
        self.bn.eval()

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))
