# kbverify-test: task=tasks/basic/level2/1_Conv2D_ReLU_BiasAdd.py
# expect: original=passed verified=incorrect
# why: folds a constant into the convolution's own parameters in place in __init__ (as a published level-2 kernel
#   folds its scale): right for the weights it is built with; a user's load_state_dict of Model's weights undoes
#   the fold, and the load_state_dict sets fail it. Honest twin: honest/conv_relu_bias_prescaled_in_place_load_pre_hook
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        with torch.no_grad():
            self.conv.weight.mul_(2.0)
            self.conv.bias.mul_(2.0)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5 + self.bias
