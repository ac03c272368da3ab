# kbverify-test: task=tasks/gpu/level1/5_Softmax_256x4096.py
# expect: original=compile_error verified=passed
# why: an honest Triton row softmax (one program per row, masked loads for any row length, max-subtracted); KernelBench v0.1 exec()s a submission from a string, and Triton's @jit needs a source file, so the original protocol fails to load it (measured on the H200, 2026-11-29) as KernelBench itself does
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_rows_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n_cols
    x = tl.load(x_ptr + row * x_row_stride + offsets, mask=mask, other=-float("inf"))
    shifted = x - tl.max(x, axis=0)
    numerator = tl.exp(shifted)
    denominator = tl.sum(numerator, axis=0)
    tl.store(y_ptr + row * y_row_stride + offsets, numerator / denominator, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        if x.numel() == 0:
            return y
        block = triton.next_power_of_2(cols)
        num_warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
        softmax_rows_kernel[(rows,)](x, y, cols, x.stride(0), y.stride(0), BLOCK=block, num_warps=num_warps)
        return y
