# kbverify-test: task=tasks/basic/level2/1_Conv2D_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of faults/conv_relu_bias_folded_in_own_block_init_stale_after_load: the block class keeps its
#   weights doubled (relu(2z)/2 = relu(z)) from its own __init__ on, and keeps them so through load_state_dict
#   (it doubles what it loads) and state_dict (it halves what it saves), so its state_dict means Model's
import torch
import torch.nn as nn


class DoubledConv(nn.Conv2d):
    def __init__(self, *args):
        super().__init__(*args)
        with torch.no_grad():
            self.weight.mul_(2.0)
            self.bias.mul_(2.0)
        self.register_state_dict_post_hook(DoubledConv._halved)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        for name in ("weight", "bias"):
            if prefix + name in state_dict:  # the dict is load_state_dict's own copy: replacing entries is local
                state_dict[prefix + name] = state_dict[prefix + name] * 2.0
        super()._load_from_state_dict(state_dict, prefix, *args)

    @staticmethod
    def _halved(module, state_dict, prefix, local_metadata):
        for name in ("weight", "bias"):
            state_dict[prefix + name] = state_dict[prefix + name] * 0.5


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = DoubledConv(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5 + self.bias
