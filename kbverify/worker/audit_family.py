"""What the audit child's phases share: one weight regime's model and inputs (`_FamilyContext`), the TF32
baseline of a set, and out-of-memory errors told apart from evidence about the task."""

from __future__ import annotations

import copy

import torch

from kbverify.core.inputs import derive_seed
from kbverify.judge.correctness import flatten_outputs, summarize
from kbverify.worker.evaluate import set_inputs
from kbverify.worker.precision import set_tf32
from kbverify.worker.worker import set_seed, short_error, synchronize


_LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _OutOfMemory(Exception):
    """The device (or host) ran out of memory: a fact about this machine's load at that moment, not about the task."""


_OUT_OF_MEMORY_MARKERS = ("out of memory", "alloc_failed", "cudaerrormemoryallocation", "can't allocate memory")


def _stop_if_out_of_memory(error: BaseException) -> None:
    if isinstance(error, _OutOfMemory):
        raise error
    if isinstance(error, MemoryError) or any(marker in str(error).lower() for marker in _OUT_OF_MEMORY_MARKERS):
        raise _OutOfMemory(short_error(error, 300)) from error


def _set_id(shape: str, distribution: str, weights: str, seed_index: int) -> str:
    return f"{shape}/{distribution}/{weights}/s{seed_index}"


def _copy_tf32(record: dict, source: str, target: str) -> dict | None:
    if source in record["tf32"]:
        record["tf32"][target] = copy.deepcopy(record["tf32"][source])
    return record["tf32"].get(target)


class _FamilyContext:
    """What the null kernels and the TF32 baseline need to re-run a set: namespace, model, device."""

    def __init__(self, namespace, model, device):
        self.namespace = namespace
        self.model = model
        self.device = device
        self._low_precision: dict = {}

    def inputs(self, meta: dict) -> list:
        return set_inputs(self.namespace, meta, self.device)

    def call(self, model, inputs, meta) -> list:
        set_seed(derive_seed(str(meta["seed"]), "call"))
        with torch.no_grad():
            output = flatten_outputs(model(*inputs))
        synchronize(self.device)
        return output

    def low_precision_model(self, name: str):
        if name not in self._low_precision:
            self._low_precision[name] = copy.deepcopy(self.model).to(_LOW_PRECISION[name])
        return self._low_precision[name]


def _tf32_summary(context: _FamilyContext, meta: dict, output: list, record: dict) -> dict | None:
    """The TF32 baseline's error against the exact reference on this set (GPU only, computed once)."""
    if context.device.type != "cuda":
        return None
    if meta["set_id"] not in record["tf32"]:
        set_tf32(matmul=True, cudnn=True)
        try:
            baseline = context.call(context.model, context.inputs(meta), meta)
        finally:
            set_tf32(matmul=False, cudnn=False)
        record["tf32"][meta["set_id"]] = summarize(output, baseline)
    return record["tf32"][meta["set_id"]]
