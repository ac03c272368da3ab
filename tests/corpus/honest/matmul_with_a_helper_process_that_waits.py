# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: the honest twin of exploits/matmul_burners_pad_the_reference_share_from_forks: a plain torch.matmul whose
#      module forks a helper process at import (as a compile server or a data loader would) that waits on a pipe
#      and does nothing else; stopping and continuing the candidate's process tree around the reference's batches
#      must leave it, and the kernel, working. The helper ends when the module's namespace goes (or its process).
import os

import torch
import torch.nn as nn


class _Helper:
    """A child process that waits on a pipe; closing the pipe ends it."""

    def __init__(self):
        read, self.write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:  # nothing of its parent's kept open but the read end: no other helper's pipe is held here
                os.closerange(3, read)
                os.closerange(read + 1, 1 << 16)
                os.read(read, 1)
            finally:
                os._exit(0)
        os.close(read)

    def __del__(self):
        os.close(self.write)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


_HELPER = _Helper()


class ModelNew(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)
