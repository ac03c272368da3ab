# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: as a library does at its first launch (a JIT's compile, a driver), its first call in each process installs a signal handler it keeps; no timer is ever armed. In the timing worker that first call is in the warm-up, whose end state is what the rounds are compared with (guards.signal_handlers); twin of exploits/relu_sets_a_signal_handler_when_timed
import signal

import torch
import torch.nn as nn


class _S:
    installed = False


def _on_signal(signum, frame):
    pass


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _S.installed:
            signal.signal(signal.SIGUSR2, _on_signal)
            _S.installed = True
        return torch.relu(x)
