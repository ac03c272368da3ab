# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=crashed verified=crashed
# why: at import, empties the file where the worker records its phase and exits, so the death looks like a worker that never started (an infrastructure error, no verdict at all); a probe worker starting fine gives it away
import os
import sys

import torch
import torch.nn as nn

for module in list(sys.modules.values()):
    phase_file = getattr(module, "_PHASE_FILE", None)
    if isinstance(phase_file, str):
        open(phase_file, "w").close()
        os._exit(3)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)
