# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: twin of exploits/relu_wrong_plants_markers_and_skips_in_hand_over.py: a correct ReLU that finds the hand-over folder the same way at import and only reads it, writing nothing there
import os
import sys

import torch
import torch.nn as nn


def _look():
    frame = sys._getframe()
    while frame is not None:
        outdir = frame.f_locals.get("outdir")
        if isinstance(outdir, str) and os.path.isdir(outdir):
            return sorted(os.listdir(outdir))
        frame = frame.f_back
    return []


SEEN = _look()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
