# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: honest twin of the kernel that returns uninitialised memory when timed: it allocates its output with torch.empty every call, as the cheat does, and then writes the whole product into it
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        out = torch.empty(A.shape[0], B.shape[1], dtype=A.dtype, device=A.device)
        torch.matmul(A, B, out=out)
        return out
