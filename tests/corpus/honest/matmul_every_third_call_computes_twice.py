# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: its calls cost unevenly (every third computes the product twice, as a kernel that re-validates a cache now and then would): each batch is credited its mean, so its speedup is its true ~0.75x, neither hidden by the median call nor a reason to reject it
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls % 3 == 0:
            torch.matmul(A, B)
        return torch.matmul(A, B)
