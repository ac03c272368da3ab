# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# warn: verified=pytorch_only
# why: plain torch.clamp behind a dead `import triton`: no triton kernel compiled or ran, so it is PyTorch only, whatever the static scan reads
import torch
import torch.nn as nn

if False:  # never runs
    import triton  # noqa: F401


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0.0)
