# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: twin of exploits/matmul_bf16_forges_judge_result_through_proc.py: the same matmul kept in fp32 end to end (B read transposed-contiguous), never looking beyond its own process
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        Bt = B.t().contiguous()
        return torch.matmul(A, Bt.t())
