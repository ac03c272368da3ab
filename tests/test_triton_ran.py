"""pytorch_only is decided from what ran where that is known: a triton kernel counts once it compiled."""

from __future__ import annotations

import sys
import types

from kbverify.worker.extensions import triton_kernels_run


def _fake_triton(monkeypatch):
    jit = types.ModuleType("triton.runtime.jit")

    class JITFunction:
        def __init__(self):
            self.device_caches = {0: ({}, None)}

    jit.JITFunction = JITFunction
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    return JITFunction


def test_no_triton_imported_means_no_triton_kernel_ran(monkeypatch):
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    assert triton_kernels_run({"x": 1}) == 0


def test_a_kernel_counts_once_compiled_and_an_unseen_one_is_unknown(monkeypatch):
    JITFunction = _fake_triton(monkeypatch)
    kernel = JITFunction()
    tuned = types.SimpleNamespace(fn=kernel)  # an autotuner wraps the kernel
    assert triton_kernels_run({"k": tuned}) == 0
    kernel.device_caches[0][0]["sig"] = object()
    assert triton_kernels_run({"k": kernel}) == 1
    assert triton_kernels_run({"nothing": 3}) is None
    assert triton_kernels_run(None) is None
