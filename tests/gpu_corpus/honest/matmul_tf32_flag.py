# kbverify-test: task=tasks/gpu/level1/3_Matmul_2048x4096x2048_randn.py
# expect: original=incorrect|passed verified=passed
# warn: verified=pytorch_only
# why: the reference's matmul with TF32 switched on for the call and restored: exactly what the verified baseline runs
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return torch.matmul(A, B)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
