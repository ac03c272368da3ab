# kbverify-test: task=tasks/basic/level1/6_Sum_reduction_over_a_dimension.py
# expect: original=passed verified=passed
# why: honest twin of exploits/row_sum_reads_only_the_first_64_rows: the reduced axis is summed in blocks of 64
#      rows and the partial sums added, over as many blocks as the axis holds, the last one short
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        length = x.shape[self.dim]
        total = None
        for start in range(0, length, 64):
            part = x.narrow(self.dim, start, min(64, length - start)).sum(dim=self.dim, keepdim=True)
            total = part if total is None else total + part
        return total
