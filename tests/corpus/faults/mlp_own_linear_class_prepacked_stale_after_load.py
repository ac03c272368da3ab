# kbverify-test: task=tasks/basic/level3/1_MLP.py
# expect: original=passed verified=incorrect
# why: its own Linear subclass scales and pre-transposes its weight in its own __init__ (undone in forward), built
#   as locals and only then put in a Sequential: right for the weights it is built with, stale after a user's
#   load_state_dict. Honest twin: honest/mlp_own_linear_class_prepacked_repacked_on_load
import torch
import torch.nn as nn


class PackedLinear(nn.Linear):
    # pre-scaled by 2 and pre-transposed once, here; forward undoes the scale
    def __init__(self, *args):
        super().__init__(*args)
        with torch.no_grad():
            self.weight.mul_(2.0)
        self.packed = self.weight.detach().t().contiguous()

    def forward(self, x):
        return nn.functional.linear(x, self.packed.t() * 0.5, self.bias)


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers = []
        current = input_size
        for size in layer_sizes:
            layers.append(PackedLinear(current, size))
            layers.append(nn.ReLU())
            current = size
        layers.append(PackedLinear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x)
