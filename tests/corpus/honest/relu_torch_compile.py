# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: torch.compile'd ReLU (dynamo rewraps torch.manual_seed on import, inductor generates the kernel): four CUDA-L1 kernels of this kind were flagged as tamper on the H200 before the guard learnt torch's own rewrap
import torch
import torch.nn as nn


def _relu(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp_min(x, 0.0)


_compiled = torch.compile(_relu, dynamic=True)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiled(x)
