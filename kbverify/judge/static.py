"""A static reading of a submission's source (AST, never executed): what code paths it claims to have and which
suspicious constructs it uses. Findings are evidence and warnings; the dynamic guards decide statuses."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_GLOBAL_KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?\w[\w\s:<>,*]*?\b(\w+)\s*\(")
_NATIVE_CALLS = {"load_inline", "load", "CUDAExtension", "CppExtension", "BuildExtension"}
_HALF_PRECISION = re.compile(r"\.half\(\)|float16|__half|\bhalf\b|tl\.float16|autocast")
_PATCH_ROOTS = {"torch", "time", "F", "nn", "gc", "sys", "builtins", "os", "kbverify"}


@dataclass(frozen=True)
class StaticScan:
    native_sources: bool
    triton: bool
    kernel_names: tuple[str, ...]
    fallback_try: bool  # a try/except around the custom path (the classic silent PyTorch fallback)
    suspicious: tuple[str, ...]
    syntax_error: str | None = None

    @property
    def has_custom_code(self) -> bool:
        return self.native_sources or self.triton


def scan(source: str) -> StaticScan:
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return StaticScan(False, False, (), False, (), syntax_error=f"line {error.lineno}: {error.msg}")
    native = triton = fallback = False
    suspicious: set[str] = set()
    triton_kernels: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node.func)
            if name.split(".")[-1] in _NATIVE_CALLS and ("cpp_extension" in name or name in _NATIVE_CALLS):
                native = True
            if name in {"gc.get_objects", "gc.get_referrers", "sys._getframe", "inspect.currentframe",
                        "inspect.stack"}:
                suspicious.add(f"introspection:{name}")
            if name.endswith("data_ptr") or name == "id":
                suspicious.add("pointer_or_id_keyed")
            if name.endswith(("Stream", "stream")) and "cuda" in name:
                suspicious.add("side_stream")
            if name in {"threading.Thread", "Thread", "concurrent.futures.ThreadPoolExecutor"}:
                suspicious.add("threads")
            if name in {"torch.Tensor._make_subclass", "_make_subclass"}:
                suspicious.add("tensor_subclass")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] + ([node.module] if isinstance(node, ast.ImportFrom)
                                                               and node.module else [])
            if any(m and m.split(".")[0] == "triton" for m in modules):
                triton = True
            if any(m and "cpp_extension" in m for m in modules):
                native = True
        elif isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                decorator_name = _call_name(decorator.func if isinstance(decorator, ast.Call) else decorator)
                if decorator_name.startswith("triton."):
                    triton = True
                    triton_kernels.append(node.name)
        elif isinstance(node, ast.ClassDef):
            if any(_call_name(base) in {"torch.Tensor", "Tensor"} for base in node.bases):
                suspicious.add("tensor_subclass")
        elif isinstance(node, ast.Try) and node.handlers:
            fallback = True
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    root = _call_name(target).split(".")[0]
                    if root in _PATCH_ROOTS:
                        suspicious.add(f"assigns:{_call_name(target)}")
    if _HALF_PRECISION.search(source):
        suspicious.add("half_precision")
    kernels = tuple(dict.fromkeys(_GLOBAL_KERNEL.findall(source) + triton_kernels))
    return StaticScan(native, triton, kernels, fallback, tuple(sorted(suspicious)))


def _call_name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _call_name(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return _call_name(node.func)
    return ""


# The compiler ran out of the machine, not into the submission: killed (the OOM killer), out of memory or disk.
# Only a lead: the submission writes the build's output, so kbverify.harness.toolchain confirms it before anyone believes it.
_HOST_RESOURCE_FAILURES = ("killed signal terminated program", "internal compiler error: killed",
                           "died due to signal", "virtual memory exhausted", "cannot allocate memory",
                           "out of memory allocating", "no space left on device", "disk quota exceeded",
                           "too many open files", "[code=127]")


def classify_build_error(text: str) -> str:
    """Why an extension did not build: PyTorch API drift is not the submission's bug, and "toolchain" (the
    machine's compilers or resources) is not the submission's at all."""
    lowered = text.lower()
    if "timed out" in lowered or "timeout" in lowered:
        return "timeout"
    # torch links every CUDA extension against cudart from CUDA_HOME: a CUDA_HOME without it (guessed from an nvcc
    # wrapper outside the toolkit) fails every such build, so it is the machine's, checked by the probe
    if any(marker in lowered for marker in ("nvcc: not found", "cuda_home", "no cuda runtime", "ninja is required",
                                            "cannot find -lcudart",
                                            "command not found", "no such file or directory: 'nvcc'",
                                            "cuda_home environment variable is not set")):
        return "toolchain"
    if any(marker in lowered for marker in _HOST_RESOURCE_FAILURES):
        return "toolchain"
    if any(marker in lowered for marker in ("deprecated", "has no member named 'type'", "data<", ".type()",
                                            "at::type", "thcuda", "thc/thc.h", "is not a member of 'at::",
                                            "is not a member of 'c10::", "no member named 'data'")):
        return "api_drift"
    return "submission_bug"
