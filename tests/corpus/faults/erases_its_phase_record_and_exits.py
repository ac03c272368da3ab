# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=crashed verified=crashed
# why: at import, announces an empty phase and then the reference's loading through the worker's own channel, and exits, so the death would look like a worker that never started or a reference that failed (an infrastructure error or unverifiable, no verdict against it); phases announced after submission code ran are not believed, and a probe worker starting fine gives it away
import os
import sys

import torch
import torch.nn as nn

worker = sys.modules.get("kbverify.worker.worker")
if worker is not None and hasattr(worker, "send"):
    worker.send({"kind": "phase", "phase": ""})
    worker.send({"kind": "phase", "phase": "reference:load"})
    os._exit(3)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)
