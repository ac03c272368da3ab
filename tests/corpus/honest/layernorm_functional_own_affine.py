# kbverify-test: task=tasks/basic/level1/4_LayerNorm.py
# expect: original=passed verified=passed
# why: F.layer_norm called by hand with the module's own affine parameters (same state_dict as the task's, so re-randomised weights reach it)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ln = self.ln
        return torch.nn.functional.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
