# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# why: starts one worker thread in __init__ that waits for work it is never given (a prefetcher left idle), alive through the whole timing: a thread that was there before the timed rounds began is no reason to reject it
import threading

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._work = threading.Event()
        self._worker = threading.Thread(target=self._work.wait, daemon=True)
        self._worker.start()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)
