# kbverify-test: task=tasks/basic/level1/2_Square_matrix_multiplication_.py
# expect: original=passed verified=passed
# max-speedup: verified=1.3
# budget: verified=2
# why: twin of exploits/matmul_shrinks_times_pads_reference_harness_by_gc_callback.py: a plain torch.matmul that registers a gc callback (threshold 10, as the exploit's) which busy-waits 50 us at every collection, whoever's phase it is, and never touches a time: the harness's work around both sides is slowed alike, nothing is shrunk, so the clock stays the worker's own and reads ~1x
import gc
import time

import torch
import torch.nn as nn


def _slow_collection(phase, info):
    if phase == "start":
        until = time.perf_counter() + 50e-6
        while time.perf_counter() < until:
            pass


gc.callbacks.append(_slow_collection)
gc.set_threshold(10)


class ModelNew(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)
