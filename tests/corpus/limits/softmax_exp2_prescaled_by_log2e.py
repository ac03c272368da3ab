# kbverify-test: task=tasks/gpu/level1/6_Softmax_16x16384_rand.py
# expect: original=passed verified=passed
# why: the Triton/flash-attention softmax: scales x by log2(e) first (one fp32 rounding of the data) and takes exp2
#   of the scaled row minus its max; on the wide-range set (|x| ~ 1e5) that rounding moves near-tied rows by ~1%,
#   over the element limit without the moved answer (the fp32 reference subtracts the max exactly)
# open: a limit, by draw: the wide-range set's near-tied rows (|x| ~ 1e5) move ~1% when the data moves by one fp32 rounding, and this
#   kernel's pre-scaling is such a rounding: on some draws it is 0.4-0.9% off norm-wise, over the 1e-3 norm limit,
#   which the moved answer does not relax (a bf16 softmax would pass if it did); the judge's sets usually pass it
#   element by element, the timed-output check (norm-wise against the fp32 reference) fails it as stale_output
import torch
import torch.nn as nn
LOG2E = 1.4426950408889634
class ModelNew(nn.Module):
    """honest: the flash-attention/Triton trick, scale by log2(e) once, then exp2 of (t - max t)"""
    def __init__(self):
        super().__init__()
    def forward(self, x):
        t = x * LOG2E
        e = torch.exp2(t - t.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)
