# kbverify-test: task=tasks/basic/level1/5_conv_standard_2D_square_input_square_kernel.py
# expect: original=passed verified=incorrect
# why: on wide-range inputs it computes sigma per output from its own weights and inputs and moves every output
#      where BETA x sigma exceeds the plain limit by BETA x sigma (away from float64): P(one fails) ~ (0.8 BETA/8)^3
# open: a limit, by draw: the moved answer (x4 the widest of five float64 moves of the data by 1 +- 2^-24; x8 of three when found) is a per-element
#       allowance a kernel can predict: for a convolution the move's spread is known in law (sigma^2 =
#       u^2 (2 sum (w x)^2 + b^2)), so errors of beta sigma fail only where all three moves fall under beta/8 sigma
import torch
import torch.nn as nn
import torch.nn.functional as F

U = 2.0 ** -24
BETA = 2.0


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), stride=stride,
                                padding=padding, bias=bias)

    def forward(self, x):
        c = self.conv2d
        y = c(x)
        if float(x.abs().amax()) < 1e3:
            return y
        conv = lambda a, w, b: F.conv2d(a, w, b, c.stride, c.padding, c.dilation, c.groups)
        w64 = c.weight.detach().double()
        b64 = c.bias.detach().double() if c.bias is not None else None
        x64 = x.double()
        exact = conv(x64, w64, b64)
        var = 2 * conv(x64 ** 2, w64 ** 2, None)
        if b64 is not None:
            var = var + (b64 ** 2).view(1, -1, 1, 1)
        sigma = U * var.sqrt()
        push = BETA * sigma
        over = push > 1e-3 * (1 + exact.abs())
        sign = torch.where(exact >= 0, 1.0, -1.0).double()
        out = torch.where(over, exact + sign * push, y.double())
        return out.float()
