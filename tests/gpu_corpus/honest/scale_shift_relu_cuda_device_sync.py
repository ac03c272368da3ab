# kbverify-test: task=tasks/gpu/level1/12_ScaleShiftReLU_4096x4096.py
# expect: original=passed verified=passed
# why: an honest fused CUDA kernel whose extension calls cudaDeviceSynchronize() after its launch (blocks inside the call: timed in sync mode, host-inclusive, for both sides)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void scale_shift_relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i] * 2.0f + 0.5f;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor scale_shift_relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "expects a float32 CUDA tensor");
    const c10::cuda::CUDAGuard guard(x.device());
    auto input = x.contiguous();
    auto output = torch::empty_like(input);
    const int64_t n = input.numel();
    if (n == 0) return output;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 64);
    scale_shift_relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), output.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    cudaDeviceSynchronize();  // the pattern: wait for the kernel before returning
    return output;
}
"""

ext = load_inline(
    name="kbverify_gpu_scale_shift_relu_sync",
    cpp_sources="torch::Tensor scale_shift_relu(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["scale_shift_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.scale_shift_relu(x)
