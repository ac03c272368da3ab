# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: its output is a slice of a buffer four times as wide (a padded layout): what crosses to the judge, and what the hand-over's size limit counts, is the output's elements, not the storage behind them
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        wide = torch.empty(x.shape[0], 4 * x.shape[1], dtype=x.dtype, device=x.device)
        out = wide[:, : x.shape[1]]
        torch.clamp_min(x, 0, out=out)
        return out
