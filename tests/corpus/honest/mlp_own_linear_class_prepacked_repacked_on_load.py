# kbverify-test: task=tasks/basic/level3/1_MLP.py
# expect: original=passed verified=passed
# why: honest twin of faults/mlp_own_linear_class_prepacked_stale_after_load: its own Linear subclass keeps its
#   weight scaled by 2 (scaling what it loads, unscaling what it saves) and a pre-transposed copy made in its
#   __init__ and again after every load, so a user's trained weights reach the copy
import torch
import torch.nn as nn


class PackedLinear(nn.Linear):
    def __init__(self, *args):
        super().__init__(*args)
        with torch.no_grad():
            self.weight.mul_(2.0)
        self._pack()
        self.register_load_state_dict_post_hook(lambda module, incompatible: module._pack())
        self.register_state_dict_post_hook(PackedLinear._unscaled)

    def _pack(self):
        self.packed = self.weight.detach().t().contiguous()

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "weight" in state_dict:
            state_dict[prefix + "weight"] = state_dict[prefix + "weight"] * 2.0
        super()._load_from_state_dict(state_dict, prefix, *args)

    @staticmethod
    def _unscaled(module, state_dict, prefix, local_metadata):
        state_dict[prefix + "weight"] = state_dict[prefix + "weight"] * 0.5

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
