# kbverify-test: task=tasks/gpu/level2/1_Conv2d_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: cuDNN convolution (PyTorch's default TF32, as the verified baseline) then one fused ReLU + per-channel bias kernel
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void relu_bias_kernel(const float* __restrict__ y, const float* __restrict__ bias,
                                 float* __restrict__ out, int64_t n, int64_t plane, int64_t channels) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = y[i];
        out[i] = (v > 0.0f ? v : 0.0f) + bias[(i / plane) % channels];
    }
}

torch::Tensor relu_bias_forward(torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(y.is_cuda() && y.dim() == 4 && y.scalar_type() == torch::kFloat, "expects a float32 NCHW CUDA tensor");
    TORCH_CHECK(bias.numel() == y.size(1), "one bias per channel");
    const c10::cuda::CUDAGuard guard(y.device());
    auto input = y.contiguous();
    auto b = bias.contiguous();
    auto output = torch::empty_like(input);
    const int64_t n = input.numel();
    if (n == 0) return output;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 64);
    relu_bias_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), b.data_ptr<float>(), output.data_ptr<float>(), n,
        input.size(2) * input.size(3), input.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return output;
}
"""

fused_ext = load_inline(
    name="kbverify_gpu_honest_conv_relu_bias",
    cpp_sources="torch::Tensor relu_bias_forward(torch::Tensor y, torch::Tensor bias);",
    cuda_sources=cuda_source,
    functions=["relu_bias_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return fused_ext.relu_bias_forward(self.conv(x), self.bias)
