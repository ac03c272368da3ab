# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: keeps a small bookkeeping object with a __del__ per call and drops the previous one, so its own code runs when objects are freed, as RAII-style wrappers do: nothing it runs outside its calls sees the next inputs, and its times stand
import torch
import torch.nn as nn


class _Ticket:
    freed = 0

    def __del__(self):
        _Ticket.freed += 1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ticket = None

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        self.ticket = _Ticket()
        return torch.matmul(A, B)
