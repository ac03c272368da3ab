# kbverify-test: task=tasks/gpu/level1/2_ReLU_16x16384.py
# expect: verified=timeout
# why: a CUDA kernel that never exits (a spin on a flag no thread ever sets, as a __syncthreads in a branch or an index that never advances does): the hang budget ends it as timeout within a minute, and the GPU stays usable for the next check. Not prebuilt: its build's forward would spin too.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void spin_kernel(const float* __restrict__ x, float* __restrict__ y, volatile int* flag, int64_t n) {
    // the flag is zero and nothing ever writes it: every thread waits forever
    while (*flag == 0) {
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}

torch::Tensor relu_spin(torch::Tensor x) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto input = x.contiguous();
    auto output = torch::empty_like(input);
    auto flag = torch::zeros({1}, input.options().dtype(torch::kInt));
    const int64_t n = input.numel();
    spin_kernel<<<64, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), output.data_ptr<float>(), flag.data_ptr<int>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return output;
}
"""

ext = load_inline(
    name="kbverify_gpu_fault_spin_forever",
    cpp_sources="torch::Tensor relu_spin(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["relu_spin"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.relu_spin(x)
