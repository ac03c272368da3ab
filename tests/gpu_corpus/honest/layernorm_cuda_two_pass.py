# kbverify-test: task=tasks/gpu/level1/7_LayerNorm_8192x1024.py
# expect: original=passed verified=passed
# why: one block per row; mean, then the variance of (x - mean) in a second pass (stable on shifted inputs); affine applied
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? scratch[lane] : 0.0f;
        w = warp_sum(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    return scratch[0];
}

__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                 const float* __restrict__ bias, float* __restrict__ y, int64_t cols, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* out = y + (int64_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += row[c];
    const float mean = block_sum(s, scratch) / (float)cols;
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = row[c] - mean;
        q += d * d;
    }
    const float var = block_sum(q, scratch) / (float)cols;
    const float rstd = 1.0f / sqrtf(var + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        out[c] = (row[c] - mean) * rstd * weight[c] + bias[c];
    }
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "expects a float32 CUDA tensor");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t cols = weight.numel();
    TORCH_CHECK(bias.numel() == cols && x.numel() % cols == 0, "normalised size mismatch");
    auto input = x.contiguous();
    auto w = weight.contiguous();
    auto b = bias.contiguous();
    auto output = torch::empty_like(input);
    const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
    if (rows == 0) return output;
    const int threads = cols >= 1024 ? 256 : 128;
    layernorm_kernel<<<rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), output.data_ptr<float>(), cols,
        static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return output;
}
"""

layernorm_ext = load_inline(
    name="kbverify_gpu_honest_layernorm",
    cpp_sources="torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);",
    cuda_sources=cuda_source,
    functions=["layernorm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
