# kbverify-test: task=tasks/basic/level1/4_LayerNorm.py
# expect: original=passed verified=passed
# why: Welford/Chan merge of per-chunk two-pass statistics: no cancellation on shifted inputs; uses the affine
import torch
import torch.nn as nn

CHUNK = 64


def _welford_mean_var(rows: torch.Tensor):
    """Population mean and variance of each row, merging chunk statistics with Chan's update."""
    n_rows, n = rows.shape
    mean = torch.zeros(n_rows, 1, device=rows.device, dtype=rows.dtype)
    m2 = torch.zeros_like(mean)
    count = 0
    for start in range(0, n, CHUNK):
        chunk = rows[:, start:start + CHUNK]
        n_b = chunk.shape[1]
        mean_b = chunk.mean(dim=1, keepdim=True)
        m2_b = ((chunk - mean_b) ** 2).sum(dim=1, keepdim=True)
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta * delta * (count * n_b / total)
        count = total
    return mean, m2 / count


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_norm = len(self.ln.normalized_shape)
        lead = x.shape[:x.dim() - n_norm]
        rows = x.reshape(-1, self.ln.weight.numel())
        mean, var = _welford_mean_var(rows)
        y = (rows - mean) * torch.rsqrt(var + self.ln.eps)
        y = y * self.ln.weight.reshape(1, -1) + self.ln.bias.reshape(1, -1)
        return y.reshape(*lead, *self.ln.normalized_shape)
