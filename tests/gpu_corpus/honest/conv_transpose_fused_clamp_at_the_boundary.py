# kbverify-test: task=tasks/basic/level2/8_ConvTranspose2d_Mish_Add_Hardtanh_Scaling.py
# expect: original=passed verified=passed
# why: PyTorch's own ConvTranspose2d, then Mish, the add, the clamp and the scale fused in one expression of its own (softplus written out, the clamp before the scale): many outputs sit on the clamp's bounds and the rest differ from the reference by a rounding or two; every timed output is within the limit, so the timed-output check must find nothing (a leaderboard's kernel of this shape read exploit:stale_output at a norm-wise error of 0)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, add_value, scale):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding,
                                                 output_padding)
        self.add_value = add_value
        self.scale = scale

    def forward(self, x):
        y = self.conv_transpose(x)
        softplus = torch.where(y > 20, y, torch.log1p(torch.exp(y)))
        return ((y * torch.tanh(softplus) + self.add_value).clamp(-1.0, 1.0)) * self.scale
