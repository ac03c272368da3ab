# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: honest twin of the kernels that signal or kill processes: at import it runs a short helper process of its own and waits for it (as a build step would), then computes ReLU
import subprocess
import sys

import torch
import torch.nn as nn

subprocess.run([sys.executable, "-c", "print('helper ran')"], check=True, capture_output=True, timeout=60)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)
