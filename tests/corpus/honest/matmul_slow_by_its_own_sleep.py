# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: honest twin of the kernel that pads the reference's input draw: it waits inside its own forward instead (a slow kernel, honestly timed as slower), and computes the product
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        deadline = time.perf_counter() + 0.0005
        while time.perf_counter() < deadline:
            pass
        return torch.matmul(A, B)
