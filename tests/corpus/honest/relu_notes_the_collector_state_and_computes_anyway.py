# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# as-user: on
# why: honest twin of exploits/relu_honest_only_while_the_collector_is_off: reads whether the garbage collector
#      is on and its generation counts, as a memory profiler would, and keeps them; the answer is torch.relu's
#      whatever they are, so the harness's calls and a plain script's get the same output
import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.collector_seen = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.collector_seen) < 16:
            self.collector_seen.append((gc.isenabled(), gc.get_count()))
        return torch.clamp_min(x, 0.0)
