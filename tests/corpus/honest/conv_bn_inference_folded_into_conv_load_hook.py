# kbverify-test: task=tasks/basic/level2/7_Conv2d_BatchNorm_inference_ReLU.py
# expect: original=passed verified=passed
# why: folds the BatchNorm (inference semantics, as the task defines it) into the convolution and keeps only the
#   folded convolution; its _load_from_state_dict takes Model's entries (conv.*, bn.*) and folds them, so weights
#   reach it through load_state_dict under Model's names although its own state_dict has other entries
import torch
import torch.nn as nn


def folded(weight, bias, gamma, beta, mean, var, eps):
    scale = gamma / torch.sqrt(var + eps)
    return weight * scale.view(-1, 1, 1, 1), (bias - mean) * scale + beta


class ModelNew(nn.Module):
    BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        bn = nn.BatchNorm2d(out_channels)  # the default statistics and affine, folded now
        self.eps = bn.eps
        with torch.no_grad():
            w, b = folded(self.conv.weight, self.conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                          self.eps)
            self.conv.weight.copy_(w)
            self.conv.bias.copy_(b)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "bn.weight" in state_dict:  # Model's layout: fold it (the dict is load_state_dict's own copy)
            bn = {name: state_dict.pop(prefix + "bn." + name, None) for name in self.BN}
            w, b = folded(state_dict[prefix + "conv.weight"], state_dict[prefix + "conv.bias"], bn["weight"],
                          bn["bias"], bn["running_mean"], bn["running_var"], self.eps)
            state_dict[prefix + "conv.weight"], state_dict[prefix + "conv.bias"] = w, b
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x):
        return torch.relu(self.conv(x))
