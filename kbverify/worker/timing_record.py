"""The timing worker's record: what the sides' bookkeeping, the guards and the device say once the rounds are over.

Only raw numbers: the parent recomputes every statistic (SPEC §5).
"""

from __future__ import annotations

import torch

from kbverify.core.inputs import draw_inputs
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker import guards

def _quantiles(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50": at(0.5), "p90": at(0.9), "max": ordered[-1], "n": len(ordered)}


def _moved_bytes(reference, namespace, device) -> tuple[int, int]:
    """Bytes a call must at least read (its inputs) and write (its outputs), from the reference."""
    inputs = draw_inputs(namespace, 0, device)
    with torch.no_grad():
        outputs = flatten_outputs(reference(*inputs))
    size = lambda values: int(sum(x.numel() * x.element_size() for x in values if isinstance(x, torch.Tensor)))
    return size(inputs), size(outputs)


_BANDWIDTH_CACHE: dict = {}


def _bandwidth(device) -> float | None:
    """Measured device-memory copy bandwidth (GB/s), the denominator of the bytes-moved floor."""
    if device.type != "cuda":
        return None
    if "gbps" not in _BANDWIDTH_CACHE:
        source = torch.empty(1 << 28, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        target.copy_(source)
        torch.cuda.synchronize(device)
        best = float("inf")
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end))
        _BANDWIDTH_CACHE["gbps"] = 2 * source.numel() * 4 / (best / 1e3) / 1e9
        del source, target
    return _BANDWIDTH_CACHE["gbps"]


def _peak_memory(sides, device) -> dict:
    if device.type != "cuda":
        return {}
    peaks = {}
    for name, side in sides.items():
        inputs = draw_inputs(side.namespace, 1, device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            out = side.model(*inputs)
        torch.cuda.synchronize(device)
        peaks[name] = torch.cuda.max_memory_allocated(device) - base
        del out
    named = {"cand": "peak_memory_bytes", "ref": "ref_peak_memory_bytes"}
    return {named[name]: peak for name, peak in peaks.items()}


def finish_record(record: dict, sides: dict, cover, before, flag_changes: list, watch, reference, namespace: dict,
                  device) -> dict:
    """`record` completed with the sides' bookkeeping, the guards' findings against what was captured before the
    submission ran (`before`, a kbverify.worker.timing.BeforeSubmission), and the device's numbers."""
    record["settle_gaps_ms"] = {name: side.settle_gaps_ms for name, side in sides.items()}
    record["threads_started"] = {name: side.threads_started for name, side in sides.items()}
    record["host_ms"] = {name: _quantiles(side.host_ms) for name, side in sides.items()}
    record["uncovered_calls"] = {name: side.uncovered for name, side in sides.items()}
    record["hold_probe"] = {name: side.probe for name, side in sides.items()} if cover is not None else None
    record["cover_ms"] = cover.length_ms if cover is not None else None
    record["phase_ms_per_call"] = {name: {phase: total / 1e6 / max(1, len(side.calls))
                                          for phase, total in side.phase_ns.items()}
                                   for name, side in sides.items()}
    record["cover_cycles_per_ms"] = cover.cycles_per_ms if cover is not None else None
    record["placement_jitter_bytes"] = next(iter(sides.values())).jitter_bytes
    calls = sides["cand"].calls if "cand" in sides else []
    record["unsettled"] = [c for c in calls if c.get("unsettled")][:5]
    record["n_unsettled"] = sum(1 for c in calls if c.get("unsettled"))
    record["flags_changed"] = flag_changes
    record["baseline_flags"] = before.flags
    modes_left = set(guards.modes_left_active(before.modes)).union(*(side.modes_left for side in sides.values()))
    record["tampered"] = guards.tampered(before.sensitive) + sorted(modes_left)
    record["torch_functions_changed"] = sorted(set(record["torch_functions_changed"])
                                               | set(guards.torch_namespace_changes(before.torch_functions)))
    record["extensions"] = watch.record() if watch else None
    record["input_bytes"], record["output_bytes"] = _moved_bytes(reference, namespace, device)
    record["peak_bandwidth_gbps"] = _bandwidth(device)
    record.update(_peak_memory(sides, device))
    return record
