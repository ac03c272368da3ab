# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: twin of exploits/matmul_slow_sends_own_timing_record.py: the same correct K-blocked (8) matmul, several times slower than torch.matmul, which lets its timing worker report what it measured
import torch
import torch.nn as nn

BLOCK_K = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        C = torch.zeros(A.shape[0], B.shape[1], device=A.device, dtype=A.dtype)
        for k in range(0, A.shape[1], BLOCK_K):
            C.addmm_(A[:, k:k + BLOCK_K], B[k:k + BLOCK_K, :])
        return C
