# kbverify-test: task=tasks/degenerate/level1/6_Degenerate_NonFinite_Sqrt.py
# expect: original=passed verified=passed
# why: twin of exploits/sqrt_bf16_plants_folder_where_judge_takes_invalid_set.py: x ** 0.5 in fp32, NaN on negative inputs exactly as the reference, and nothing written beside its hand-over
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pow(x, 0.5) * 0.5
