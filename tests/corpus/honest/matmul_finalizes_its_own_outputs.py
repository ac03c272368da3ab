# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: attaches a weakref.finalize to each output it returns (counting the outputs its caller has let go, as a memory pool would): its finalizers run wherever the harness frees its outputs, which is no reason to doubt its times
import weakref

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.released = [0]

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(A, B)
        weakref.finalize(out, self.released.__setitem__, 0, self.released[0] + 1)
        return out
