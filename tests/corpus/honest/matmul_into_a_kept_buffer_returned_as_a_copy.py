# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: the honest twin of exploits/matmul_makes_its_product_in_the_harness_copy_step: the product is made inside the call, into a buffer the module keeps, and returned as a fresh copy; all of its work is on the call's own clock, so its times account for the parent's and are confirmed
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.buffer = None

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        shape = (A.shape[0], B.shape[1])
        if self.buffer is None or tuple(self.buffer.shape) != shape or self.buffer.dtype != A.dtype \
                or self.buffer.device != A.device:
            self.buffer = torch.empty(shape, dtype=A.dtype, device=A.device)
        torch.matmul(A, B, out=self.buffer)
        return self.buffer.clone()
