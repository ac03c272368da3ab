import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super(ModelNew, self).__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Single pass over the data: accumulate sum and sum of squares together.
        dims = tuple(range(x.dim() - len(self.ln.normalized_shape), x.dim()))
        n = 1
        for d in dims:
            n *= x.shape[d]
        s1 = x.sum(dim=dims, keepdim=True)
        s2 = (x * x).sum(dim=dims, keepdim=True)
        mean = s1 / n
        var = s2 / n - mean * mean
        return (x - mean) * torch.rsqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias
