# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: bounds a setup step in its __init__ with a SIGALRM timer and handler, then disarms the timer and puts the previous handler back: the signal state at every batch is the one before it loaded, so the per-batch signal check has nothing to report
import signal

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

        def too_slow(signum, frame):
            raise TimeoutError("setup took too long")

        previous = signal.signal(signal.SIGALRM, too_slow)
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        try:
            self.scale = torch.ones(1)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B) * self.scale
