# kbverify-test: task=tasks/basic/level1/5_conv_standard_2D_square_input_square_kernel.py
# expect: original=passed verified=passed
# why: convolution summed one kernel offset at a time (a channel contraction per offset, then the offsets added):
#      fp32 throughout, in another order than the reference, so on the wide-range inputs its cancelling outputs
#      round differently; the reference-rounding allowance must let it through
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
        kh, kw = conv.kernel_size
        sh, sw = conv.stride
        ph, pw = conv.padding
        x = F.pad(x, (pw, pw, ph, ph))
        h_out = (x.shape[2] - kh) // sh + 1
        w_out = (x.shape[3] - kw) // sw + 1
        out = None
        for i in range(kh):
            for j in range(kw):
                window = x[:, :, i:i + sh * (h_out - 1) + 1:sh, j:j + sw * (w_out - 1) + 1:sw]
                term = torch.einsum("nchw,oc->nohw", window, conv.weight[:, :, i, j])
                out = term if out is None else out + term
        if conv.bias is not None:
            out = out + conv.bias.reshape(1, -1, 1, 1)
        return out
