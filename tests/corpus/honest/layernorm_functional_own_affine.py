# kbverify-test: task=tasks/basic/level1/4_LayerNorm.py
# expect: original=passed verified=passed
# why: F.layer_norm with parameters registered under other names (copied from an nn.LayerNorm built like the task's), affine applied
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        reference = nn.LayerNorm(normalized_shape=normalized_shape)
        self.normalized_shape = tuple(normalized_shape)
        self.gamma = nn.Parameter(reference.weight.detach().clone())
        self.beta = nn.Parameter(reference.bias.detach().clone())
        self.eps = reference.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, self.normalized_shape, self.gamma, self.beta, self.eps)
