# kbverify-test: task=tasks/basic/level2/1_Conv2D_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of faults/conv_relu_bias_prescaled_in_place_stale_after_load: folds the constant into the
#   convolution's parameters in place in __init__, and a load_state_dict pre-hook on ModelNew folds it into
#   whatever is loaded (a state_dict post-hook unfolds what is saved), so a user's trained weights work too
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    FOLDED = ("conv.weight", "conv.bias")

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        with torch.no_grad():
            self.conv.weight.mul_(2.0)
            self.conv.bias.mul_(2.0)
        self.register_load_state_dict_pre_hook(ModelNew._fold)
        self.register_state_dict_post_hook(ModelNew._unfold)

    @staticmethod
    def _fold(module, state_dict, prefix, *args):
        # runs before the submodules load, on the dict they read from
        for name in ModelNew.FOLDED:
            if prefix + name in state_dict:
                state_dict[prefix + name] = state_dict[prefix + name] * 2.0

    @staticmethod
    def _unfold(module, state_dict, prefix, local_metadata):
        for name in ModelNew.FOLDED:
            state_dict[prefix + name] = state_dict[prefix + name] * 0.5

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5 + self.bias
