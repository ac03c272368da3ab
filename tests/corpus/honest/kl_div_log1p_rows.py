# kbverify-test: task=tasks/basic/level1/16_KLDivLoss.py
# expect: original=passed verified=passed
# why: KL divergence with each term's log ratio taken as log1p((t − p)/p) where t and p are close (t − p is then exact in fp32) and as log t − log p elsewhere, summed per row, then averaged: on the shifted set the reference's log t − log p cancels to noise (thousands of times the tolerance off float64) and this kernel is closer to float64 than the reference
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        close = (targets - predictions).abs() < 0.5 * predictions
        log_ratio = torch.where(close, torch.log1p((targets - predictions) / predictions),
                                torch.log(targets) - torch.log(predictions))
        return (targets * log_ratio).sum(dim=1).mean()
