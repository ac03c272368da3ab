# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: honest twin of the kernels that tell the timing worker from the correctness worker: it reads what it can of its worker (the announced party, gc state) and computes the same thing whatever it finds
import gc
import sys

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        worker = sys.modules.get("kbverify.worker.worker")
        seen = (worker.last_phase() if worker is not None and hasattr(worker, "last_phase") else "", gc.isenabled())
        assert isinstance(seen[0], str)
        return torch.relu(x)
