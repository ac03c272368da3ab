# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# warn: verified=audit_hook_dropped
# why: torch.compile's GPU stack (torch 2.11 with Triton) installs an audit hook of its own and works without it:
#   workers drop a further hook quietly (it could watch the harness's audited calls) and that is no tamper. Here
#   the submission's own import-time code stands in for the library.
import sys

import torch
import torch.nn as nn

_seen_events = []


def _library_hook(event, args):
    if event == "import" and len(_seen_events) < 4:
        _seen_events.append(event)


sys.addaudithook(_library_hook)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0.0)
