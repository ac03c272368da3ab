"""The exact answer, in the judge's process: the reference model run in float64 (what the verified rule is stated
on), and the same with the data one fp32 rounding away (how far that answer itself moves, element by element,
under the rounding an honest kernel may apply to its data). Also the one forward every check makes."""

from __future__ import annotations

import gc

import torch

from kbverify.core.inputs import clone_inputs, derive_seed
from kbverify.judge.correctness import CHUNK_ELEMENTS, TOLERANCE_GRID, flatten_outputs
from kbverify.worker.worker import set_seed, short_error


def checked_call(model, inputs, call_seed: int):
    """One forward. The collector is off during it, as in every timed call (kbverify.worker.timing): nothing a
    forward can look at (the collector's state among it) tells a checked call from a timed one."""
    set_seed(call_seed)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.no_grad():
            return model(*inputs)
    finally:
        if collecting:
            gc.enable()


FP64_INPUT_BYTES_LIMIT = 2 << 30
FP32_UNIT_ROUNDOFF = 2.0 ** -24


def fp64_truth(model, inputs: list, call_seed: int, nudge_seed: int | None = None) -> tuple[list | None, str]:
    """The reference model run in float64 on the same inputs: the exact answer the verified rule is stated on,
    and against which the fp32 reference's own error is measured (an honest fp32 kernel that sums in another order
    differs from the reference by about that much). (None, why) where there is no such run.

    `nudge_seed`: the exact answer of the data one fp32 rounding away instead. Every floating input, parameter and
    buffer is multiplied by 1 ± 2⁻²⁴ (signs drawn from the seed): how far that moves the answer is what an honest
    kernel that rounds the data once (folds a BatchNorm into a weight, pre-scales an input) may cost on outputs
    that cancel among large terms."""
    import copy

    size = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    if size > FP64_INPUT_BYTES_LIMIT:
        return None, f"inputs of {size / 2**30:.1f} GiB, above the float64 run's limit of " \
                     f"{FP64_INPUT_BYTES_LIMIT / 2**30:.0f} GiB"
    try:
        wide = copy.deepcopy(model).double()
        wide_inputs = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                       for x in clone_inputs(inputs)]
        if nudge_seed is not None:
            _nudge(wide, wide_inputs, nudge_seed)
        truth = flatten_outputs(checked_call(wide, wide_inputs, call_seed))
        del wide
    except BaseException as error:  # noqa: BLE001 - some models have no float64 path; the record says so
        return None, "the float64 run raised: " + short_error(error, 300)
    return truth, ""


def _nudge(model, inputs: list, seed: int) -> None:
    """Multiply every floating tensor of a float64 model and its inputs by 1 ± the fp32 unit roundoff, in place."""
    generators: dict = {}  # one per device: any signs serve, and drawing them where the tensor is costs no copy
    tensors = [t for t in (*model.parameters(), *model.buffers(), *inputs)
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    with torch.no_grad():
        for tensor in tensors:
            if tensor.device not in generators:
                generators[tensor.device] = torch.Generator(device=tensor.device).manual_seed(seed)
            signs = torch.randint(0, 2, tensor.shape, generator=generators[tensor.device], dtype=torch.float64,
                                  device=tensor.device)
            tensor.mul_(signs.mul_(2 * FP32_UNIT_ROUNDOFF).add_(1 - FP32_UNIT_ROUNDOFF))


MOVES = 5  # the widest of five (MOVED_FACTOR says why)


def over_plain_limits(against: dict) -> bool:
    """Whether the candidate has an element past the plain limits of the strictest tolerances a protocol uses
    (1e-4 and up): only then can the moved answer change its verdict, and only then is it worth the float64
    runs."""
    return any("grid" in part and part["grid"][repr(1e-4)]["max_ratio"] > 1.0 for part in against.get("outputs", []))


def moved_spreads(model, inputs: list, call_seed: int, truth: list, nudge_seed: int) -> list | None:
    """Per output, element by element, the widest `moved_spread` over MOVES float64 runs of the data
    one fp32 rounding away; None where a run fails or its outputs do not match the exact answer's."""
    widest = None
    for move in range(MOVES):
        moved, _ = fp64_truth(model, inputs, call_seed, nudge_seed=derive_seed(str(nudge_seed), "move", move))
        if moved is None or len(moved) != len(truth) or any(
                not isinstance(m, torch.Tensor) or m.shape != t.shape for m, t in zip(moved, truth)):
            return None
        spread = [moved_spread(t, m) for t, m in zip(truth, moved)]
        widest = spread if widest is None else [torch.maximum(a, b) for a, b in zip(widest, spread)]
        del moved
    return widest


MOVED_FACTOR = 4.0
# Measured on the CPU (a BatchNorm folded into a convolution, wide-range and shifted sets, six secrets): an honest
# fold's elements over the plain limit were at most 1.92 times the widest of two or three moves (93 times a
# single one: one random move can leave an element almost still by chance). Elements pushed two predicted
# spreads off (a convolution's spread is known in law) pass at a factor of 8: five moves at 4 leave honest
# kernels a factor of two and such a push about one spread.


def moved_spread(truth, moved):
    """Per element, |moved − truth| / (1 + |truth|) in float64: the scale the element-wise limits use."""
    import torch

    t = truth.detach().reshape(-1).to(torch.float64)
    return (moved.detach().reshape(-1).to(device=t.device, dtype=torch.float64) - t).abs() / (1.0 + t.abs())


def summarize_within_moved(truth, candidate, spreads: list, factor: float = MOVED_FACTOR) -> dict:
    """The candidate against float64, each element's limit at every tolerance of the grid raised to `factor` times
    its own spread (`moved_spread`, the widest over the moves) where that is larger. Per output: the worst ratio,
    the count over, and the widest limit (what bounds the audit screen)."""
    refs, cands = flatten_outputs(truth), flatten_outputs(candidate)
    if len(refs) != len(cands) or len(refs) != len(spreads):
        return {"structure_mismatch": f"{len(refs)} float64 outputs, {len(cands)} candidate outputs"}
    return {"outputs": [_within_moved(r, c, spread, factor) for r, c, spread in zip(refs, cands, spreads)],
            "factor": factor}


def _within_moved(ref, cand, spread, factor: float) -> dict:
    import torch

    if not isinstance(cand, torch.Tensor) or cand.shape != ref.shape or spread.numel() != ref.numel():
        return {"error": "the candidate's output does not match the float64 one"}
    t = ref.detach().reshape(-1).to(torch.float64)
    c = cand.detach().reshape(-1).to(device=t.device, dtype=torch.float64)
    grid = {repr(tol): {"max_ratio": 0.0, "over": 0, "allowance_max_ratio": 1.0} for tol in TOLERANCE_GRID}
    for start in range(0, t.numel(), CHUNK_ELEMENTS):
        r_chunk, c_chunk = t[start:start + CHUNK_ELEMENTS], c[start:start + CHUNK_ELEMENTS]
        widened = spread[start:start + CHUNK_ELEMENTS].to(t.device) * factor
        if not (bool(torch.isfinite(r_chunk).all()) and bool(torch.isfinite(c_chunk).all())
                and bool(torch.isfinite(widened).all())):
            return {"error": "a value is not finite"}
        scaled = (c_chunk - r_chunk).abs() / (1.0 + r_chunk.abs())
        for tol in TOLERANCE_GRID:
            entry = grid[repr(tol)]
            limit = widened.clamp(min=tol)
            ratio = scaled / limit
            entry["max_ratio"] = max(entry["max_ratio"], float(ratio.max()) if ratio.numel() else 0.0)
            entry["over"] += int(torch.count_nonzero(ratio > 1.0))
            entry["allowance_max_ratio"] = max(entry["allowance_max_ratio"],
                                               float(limit.max()) / tol if limit.numel() else 1.0)
    return {"numel": t.numel(), "factor": factor, "grid": grid}
