# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: the honest twin of exploits/matmul_burners_pad_the_reference_share_from_forks: a plain torch.matmul whose
#      module forks a helper process at import (as a compile server or a data loader would) that waits on a pipe
#      and does nothing else; stopping and continuing the candidate's process tree around the reference's batches
#      must leave it, and the kernel, working
import os

import torch
import torch.nn as nn

_READ, _WRITE = os.pipe()
if os.fork() == 0:
    os.close(_WRITE)
    try:
        os.read(_READ, 1)  # returns when the module's process exits and the pipe closes
    finally:
        os._exit(0)
os.close(_READ)


class ModelNew(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)
