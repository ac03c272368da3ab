# kbverify-test: task=tasks/basic/level1/5_conv_standard_2D_square_input_square_kernel.py
# expect: original=passed verified=passed
# why: convolution as im2col (unfold) + GEMM, a different algorithm with the same parameters and state_dict keys
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), stride=stride,
                                padding=padding, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv2d
        n, _, h, w = x.shape
        kh, kw = conv.kernel_size
        sh, sw = conv.stride
        ph, pw = conv.padding
        h_out = (h + 2 * ph - kh) // sh + 1
        w_out = (w + 2 * pw - kw) // sw + 1
        cols = F.unfold(x, (kh, kw), padding=(ph, pw), stride=(sh, sw))  # (n, c*kh*kw, L)
        weight = conv.weight.reshape(conv.out_channels, -1)
        out = torch.matmul(weight, cols)  # (n, out, L)
        if conv.bias is not None:
            out = out + conv.bias.reshape(1, -1, 1)
        return out.reshape(n, conv.out_channels, h_out, w_out)
