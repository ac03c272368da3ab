"""Where an audit of one task holds the most memory, counted on a CPU in tensors of a chosen size.

    python3 scripts/audit_memory_profile.py TASK.py [--unit-bytes N] [--chunk-elements N]

Runs the audit worker on TASK (shrink a KernelBench task's sizes first: the worker runs for real) under a torch
dispatch mode that tracks every storage an operation creates (at least an eighth of --unit-bytes; default: the
first input's bytes) until it is freed. Prints the peak in units, the audit phase and the worker's frames at the
peak, and the live storages then with the operations that made them. Pass --chunk-elements so that the worker's
chunked reductions see the same number of chunks as at the real size (KernelBench's 10⁹-element outputs are
reduced in 2²⁵-element chunks); the H200's recorded peaks matched these counts within the allocator's slack
(FrobeniusNorm: 9 input-sized tensors counted, 70 GiB for 15 GiB of tensors measured).
"""

from __future__ import annotations

import argparse
import sys
import traceback
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from kbverify.audit import AuditSettings, worker_payload  # noqa: E402
from kbverify.core.tasks import load_task  # noqa: E402
from kbverify.judge import correctness  # noqa: E402
from kbverify.worker import audit_tensors, worker  # noqa: E402
from kbverify.worker.evaluate import shape_namespaces  # noqa: E402


class LiveStorages(TorchDispatchMode):
    """Every storage an operation creates, from its creation until it is freed; the peak of their sum."""

    def __init__(self, smallest_bytes: int):
        super().__init__()
        self.smallest_bytes = smallest_bytes
        self.live: dict[int, tuple[int, str]] = {}  # storage address → (bytes, the op that made it)
        self.total = self.peak = 0
        self.at_peak: tuple[str, list[str], list[tuple[int, str]]] = ("", [], [])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor, str(func))
        return out

    def _track(self, tensor: torch.Tensor, op: str) -> None:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.live or size < self.smallest_bytes:
            return
        self.live[key] = (size, op)
        self.total += size
        weakref.finalize(storage, self._freed, key)
        if self.total > self.peak:
            frames = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack(limit=16) if "kbverify" in f.filename]
            self.peak, self.at_peak = self.total, (worker.phase_kind(worker.last_phase()), frames[-6:], sorted(
                self.live.values(), reverse=True))

    def _freed(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.total -= entry[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", type=Path)
    parser.add_argument("--unit-bytes", type=int, default=None)
    parser.add_argument("--chunk-elements", type=int, default=None)
    parser.add_argument("--hidden", action="store_true", help="also the task's generated hidden shapes")
    args = parser.parse_args()
    if args.chunk_elements:
        correctness.CHUNK_ELEMENTS = audit_tensors.CHUNK_ELEMENTS = args.chunk_elements
    task = load_task(args.task)
    payload = worker_payload(task, protocols=["original", "kbv", "verified"],
                             settings=AuditSettings(hidden_shapes=args.hidden), device="cpu")
    unit = args.unit_bytes
    if unit is None:
        namespace = shape_namespaces(task, [{"shape": "original", "overrides": {}}])["original"]
        first = next(v for v in namespace["get_inputs"]() if isinstance(v, torch.Tensor))
        unit = first.numel() * first.element_size()
    torch.set_num_threads(1)
    with LiveStorages(unit // 8) as mode:
        worker.run_job("audit", payload)
    phase, frames, live = mode.at_peak
    print(f"peak {mode.peak / unit:.2f} units of {unit} bytes, in {phase}")
    print("  at " + " < ".join(reversed(frames)))
    for size, op in live:
        print(f"  {size / unit:6.2f}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
