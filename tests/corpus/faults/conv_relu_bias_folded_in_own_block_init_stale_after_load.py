# kbverify-test: task=tasks/basic/level2/1_Conv2D_ReLU_BiasAdd.py
# expect: original=passed verified=incorrect
# why: folds a constant into its convolution in its own block class's __init__ (relu(2z)/2 = relu(z)) and
#   nothing else: right for the weights it is built with, which the construction handover gives it, and wrong for
#   weights a user loads afterwards (load_state_dict puts Model's values back, unfolded): the load_state_dict sets
#   fail it. Honest twin: honest/conv_relu_bias_folded_in_own_block_init_and_on_load
import torch
import torch.nn as nn


class DoubledConv(nn.Conv2d):
    def __init__(self, *args):
        super().__init__(*args)
        with torch.no_grad():
            self.weight.mul_(2.0)
            self.bias.mul_(2.0)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = DoubledConv(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5 + self.bias
