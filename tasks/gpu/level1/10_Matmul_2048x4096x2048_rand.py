import torch
import torch.nn as nn


class Model(nn.Module):
    """
    C = A @ B with non-negative inputs (KernelBench's torch.rand): a bf16 product passes 1e-2 but not 1e-3.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 2048
K = 4096
N = 2048


def get_inputs():
    A = torch.rand(M, K)
    B = torch.rand(K, N)
    return [A, B]


def get_init_inputs():
    return []
