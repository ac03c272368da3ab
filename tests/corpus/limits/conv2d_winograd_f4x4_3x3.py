# kbverify-test: task=tasks/basic/level1/5_conv_standard_2D_square_input_square_kernel.py
# expect: original=passed verified=passed
# why: Winograd F(4x4, 3x3) in fp32 (Lavin & Gray's transforms; the fp32 algorithm of cuDNN's WINOGRAD_NONFUSED,
#      oneDNN's and NNPACK's): the input, filter and output transforms round at the scale of the tile's largest
#      inputs (x1e5 on the wide-range set) with multipliers up to 25 and 1/24, so on outputs that cancel it lands
# open: fails the wide-range set at 3df52a7 and under 301a54a alike: more elements over than the tail's share
#   (1e-4, or 16x the reference's 8.7e-6), the worst ratio past 16x the reference's on some draws, the moved answer
#   x3-6 over (its spread moves the data, not the transforms' intermediates), and on one draw in five the largest
#   absolute error past 16x the reference's (0.277 against 16 x 0.0169 = 0.270): the new clause sits within a
#   factor of 1 of an honest Winograd's error. CLI, secret bdda1a72802eb849: incorrect at 3df52a7 (3 sets failed,
#   first original/wide/default/s0: x18.2 off float64 where 16x the reference's x1.03 is x16.5; largest |error|
#   0.236 against 16 x 0.0162; moved x4.9, 25 elements over) and incorrect under 301a54a (same set, moved x4.9, 22
#   over). In-process, secret "survey", wide sets s0-s4: 4 of 5 fail under both (s3: 0.277 > 16 x 0.0169)
#      ~10-16x the fp32 reference's own largest absolute error off float64 (0.20-0.28 where the reference is
#      0.017-0.020), at x9-26 of the element limit on 2-3.4e-4 of the elements; norm-wise 5e-7
import torch
import torch.nn as nn
import torch.nn.functional as F

BT = torch.tensor([[4., 0., -5., 0., 1., 0.], [0., -4., -4., 1., 1., 0.], [0., 4., -4., -1., 1., 0.],
                   [0., -2., -1., 2., 1., 0.], [0., 2., -1., -2., 1., 0.], [0., 4., 0., -5., 0., 1.]])
G = torch.tensor([[1 / 4, 0., 0.], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0., 0., 1.]])
AT = torch.tensor([[1., 1., 1., 1., 1., 0.], [0., 1., -1., 2., -2., 0.], [0., 1., 1., 4., 4., 0.],
                   [0., 1., -1., 8., -8., 1.]])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), stride=stride,
                                padding=padding, bias=bias)

    def forward(self, x):
        c = self.conv2d
        if c.kernel_size != (3, 3) or c.stride != (1, 1) or c.padding != (0, 0):
            return c(x)
        ho, wo = x.shape[2] - 2, x.shape[3] - 2
        ph, pw = (-ho) % 4, (-wo) % 4
        xp = F.pad(x, (0, pw, 0, ph))
        d = xp.unfold(2, 6, 4).unfold(3, 6, 4)  # B, C, th, tw, 6, 6
        v = torch.einsum("ij,bcxyjk,lk->bcxyil", BT, d, BT)
        u = torch.einsum("ij,ocjk,lk->ocil", G, c.weight, G)
        m = torch.einsum("ocil,bcxyil->boxyil", u, v)
        y = torch.einsum("ij,boxyjk,lk->boxyil", AT, m, AT)  # B, O, th, tw, 4, 4
        b, o, th, tw = y.shape[:4]
        y = y.permute(0, 1, 2, 4, 3, 5).reshape(b, o, th * 4, tw * 4)[:, :, :ho, :wo]
        return y + c.bias.view(1, -1, 1, 1) if c.bias is not None else y
