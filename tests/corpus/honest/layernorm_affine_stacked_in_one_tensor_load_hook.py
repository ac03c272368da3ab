# kbverify-test: task=tasks/basic/level1/4_LayerNorm.py
# expect: original=passed verified=passed
# why: honest twin of exploits/layernorm_own_layout_hook_swallows_loaded_weights: keeps weight and bias stacked in
#   one parameter (another layout than Model's) and its _load_from_state_dict stacks Model's ln.weight and ln.bias
#   into it, so the re-randomised weights reach it through load_state_dict and it applies them
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.affine = nn.Parameter(torch.stack([torch.ones(normalized_shape), torch.zeros(normalized_shape)]))

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "ln.weight" in state_dict:  # Model's layout (the dict is load_state_dict's own copy)
            state_dict[prefix + "affine"] = torch.stack([state_dict.pop(prefix + "ln.weight"),
                                                         state_dict.pop(prefix + "ln.bias")])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, self.normalized_shape, self.affine[0], self.affine[1], 1e-5)
