# kbverify-test: task=tasks/basic/level1/1_ReLU.py
# expect: original=passed verified=passed
# why: an honest C++ CPU kernel built with load_inline; writes a fresh output tensor
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_cpp_source = r"""
torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "relu_forward is a CPU kernel");
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "relu_forward expects float32");
    auto input = x.contiguous();
    auto output = torch::empty_like(input);
    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    const int64_t n = input.numel();
    for (int64_t i = 0; i < n; ++i) {
        out[i] = in[i] > 0.0f ? in[i] : 0.0f;
    }
    return output;
}
"""

relu_ext = load_inline(
    name="kbverify_relu_cpp",
    cpp_sources=relu_cpp_source,
    functions=["relu_forward"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return relu_ext.relu_forward(x.cpu()).to(x.device)
        return relu_ext.relu_forward(x)
