import torch
import torch.nn as nn

BLOCK_K = 64


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        # Split K into blocks and accumulate in fp32.
        C = torch.zeros(A.shape[0], B.shape[1], device=A.device, dtype=A.dtype)
        for k in range(0, A.shape[1], BLOCK_K):
            C.addmm_(A[:, k:k + BLOCK_K], B[k:k + BLOCK_K, :])
        return C
