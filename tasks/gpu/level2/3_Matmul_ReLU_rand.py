import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Matmul followed by ReLU on non-negative inputs (KernelBench's torch.rand), where the ReLU changes nothing.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.matmul(A, B))


M = 1024
K = 512
N = 1024


def get_inputs():
    A = torch.rand(M, K)
    B = torch.rand(K, N)
    return [A, B]


def get_init_inputs():
    return []
