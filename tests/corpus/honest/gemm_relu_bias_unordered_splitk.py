# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: split-K with the chunks summed in an order that changes from call to call (as atomicAdd does on a GPU); honest, so the two-run determinism guard must tolerate its rounding
import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        weight = self.gemm.weight
        chunks = list(range(0, x.shape[1], 32))
        order = sorted(chunks, key=lambda _: os.urandom(2))  # hardware scheduling, not the seeded RNG
        acc = torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        for start in order:
            acc += x[:, start:start + 32] @ weight[:, start:start + 32].t()
        return torch.relu(acc) + self.bias
