# kbverify-test: task=tasks/gpu/level1/8_Sum_reduction_rows.py
# expect: original=passed verified=passed
# why: sum over any dimension, viewed as (outer, reduced, inner); contiguous rows get a block each, strided ones a thread each; double accumulators
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__device__ __forceinline__ double warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// inner == 1: one block per output element, the reduced elements are contiguous.
__global__ void sum_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t reduced) {
    __shared__ double scratch[32];
    const float* row = x + (int64_t)blockIdx.x * reduced;
    double s = 0.0;
    for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x) s += (double)row[r];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    s = warp_sum(s);
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        double w = lane < warps ? scratch[lane] : 0.0;
        w = warp_sum(w);
        if (lane == 0) y[blockIdx.x] = (float)w;
    }
}

// inner > 1: one thread per output element; neighbouring threads read neighbouring addresses.
__global__ void sum_strided_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t outer,
                                   int64_t reduced, int64_t inner) {
    const int64_t total = outer * inner;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const int64_t o = k / inner, i = k % inner;
        const float* base = x + o * reduced * inner + i;
        double s = 0.0;
        for (int64_t r = 0; r < reduced; ++r) s += (double)base[r * inner];
        y[k] = (float)s;
    }
}

torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "expects a float32 CUDA tensor");
    const c10::cuda::CUDAGuard guard(x.device());
    auto input = x.contiguous();
    const int64_t nd = input.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dimension out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= input.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= input.size(d);
    const int64_t reduced = input.size(dim);
    auto sizes = input.sizes().vec();
    sizes[dim] = 1;
    auto output = torch::empty(sizes, input.options());
    if (output.numel() == 0) return output;
    if (reduced == 0) return output.zero_();
    auto stream = at::cuda::getCurrentCUDAStream();
    if (inner == 1) {
        sum_rows_kernel<<<outer, 256, 0, stream>>>(input.data_ptr<float>(), output.data_ptr<float>(), reduced);
    } else {
        const int64_t blocks = std::min<int64_t>((outer * inner + 255) / 256, 132 * 32);
        sum_strided_kernel<<<blocks, 256, 0, stream>>>(input.data_ptr<float>(), output.data_ptr<float>(), outer,
                                                       reduced, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return output;
}
"""

sum_ext = load_inline(
    name="kbverify_gpu_honest_sum",
    cpp_sources="torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim);",
    cuda_sources=cuda_source,
    functions=["sum_dim_keepdim"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_keepdim(x, self.dim)
