# kbverify-test: task=tasks/basic/level1/4_LayerNorm.py
# expect: original=passed verified=passed
# why: honest twin of layernorm_skips_affine_seen_default_at_init: skips an identity affine too, but decides from
#   the weights it holds at each call, so weights loaded after construction are applied
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(x.dim() - len(self.ln.normalized_shape), x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        centered = x - mean
        var = (centered * centered).mean(dim=dims, keepdim=True)
        normed = centered * torch.rsqrt(var + self.ln.eps)
        if bool((self.ln.weight == 1).all() and (self.ln.bias == 0).all()):
            return normed
        return normed * self.ln.weight + self.ln.bias
