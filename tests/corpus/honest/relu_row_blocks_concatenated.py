# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: honest twin of exploits/relu_returns_a_list_that_answers_like_a_tensor: the rows are computed in blocks
#      collected in a Python list, and the list is joined into the one tensor Model returns
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        blocks = [torch.clamp_min(block, 0.0) for block in x.split(5, dim=0)]
        return torch.cat(blocks, dim=0)
