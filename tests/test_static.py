from kbverify.judge.static import classify_build_error, scan


def test_native_extension_and_kernel_names_are_found():
    source = '''
from torch.utils.cpp_extension import load_inline
cuda_src = """
__global__ void relu_kernel(const float* x, float* y, int n) { }
__global__ __launch_bounds__(256) void fused_add(float* a) { }
"""
mod = load_inline(name="x", cpp_sources="", cuda_sources=cuda_src, functions=["f"])
'''
    result = scan(source)
    assert result.native_sources and not result.triton
    assert result.kernel_names == ("relu_kernel", "fused_add")
    assert result.has_custom_code


def test_triton_kernels_are_custom_code():
    source = "import triton\nimport triton.language as tl\n@triton.jit\ndef add_kernel(x):\n    pass\n"
    result = scan(source)
    assert result.triton and result.kernel_names == ("add_kernel",)


def test_plain_torch_has_no_custom_code():
    result = scan("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")
    assert not result.has_custom_code and not result.suspicious


def test_suspicious_constructs_are_listed():
    source = ("import gc, sys, torch, time\n"
              "time.perf_counter = lambda: 0.0\n"
              "def f(x):\n    gc.get_objects(); sys._getframe(1)\n    return x.data_ptr()\n"
              "try:\n    import foo\nexcept ImportError:\n    pass\n")
    result = scan(source)
    assert "assigns:time.perf_counter" in result.suspicious
    assert "introspection:gc.get_objects" in result.suspicious
    assert "introspection:sys._getframe" in result.suspicious
    assert "pointer_or_id_keyed" in result.suspicious
    assert result.fallback_try


def test_syntax_errors_are_reported_not_raised():
    assert scan("def (:\n").syntax_error


def test_build_errors_are_classified():
    assert classify_build_error("error: 'class at::Tensor' has no member named 'type'") == "api_drift"
    assert classify_build_error("CUDA_HOME environment variable is not set") == "toolchain"
    assert classify_build_error("c++: fatal error: Killed signal terminated program cc1plus") == "toolchain"
    assert classify_build_error("/usr/bin/ld: final link failed: No space left on device") == "toolchain"
    assert classify_build_error("kernel.cu(12): error: identifier \"blockDimx\" is undefined") == "submission_bug"
