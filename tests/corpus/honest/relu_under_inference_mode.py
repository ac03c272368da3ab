# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: a forward decorated with torch.inference_mode returns inference tensors, bit for bit torch.relu; every
#      step that touches an output after the call (NaN fill, copies, hand-over, guards) must accept them
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    @torch.inference_mode()
    def forward(self, x):
        return torch.relu(x)
