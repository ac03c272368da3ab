"""The audit child's reductions of outputs to statistics. Outputs of 10⁹ elements are reduced in chunks
(`CHUNK_ELEMENTS`), never copied whole to float64."""

from __future__ import annotations

import math

import torch

from kbverify.audit.records import NEAR_ATOLS
from kbverify.judge.correctness import CHUNK_ELEMENTS


def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _as_float(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _float_chunks(t: torch.Tensor):
    """`_as_float(t)` in consecutive pieces of the flattened tensor, none copied whole."""
    flat = t.detach().reshape(-1)
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield _as_float(flat[start:start + CHUNK_ELEMENTS])


def _norm64(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t, dtype=torch.float64))


def _norm(t: torch.Tensor) -> float:
    if not t.numel():
        return 0.0
    if t.numel() <= CHUNK_ELEMENTS:
        return _norm64(_as_float(t))
    return math.sqrt(sum(_norm64(chunk) ** 2 for chunk in _float_chunks(t)))


def _difference_norm(x: torch.Tensor, y: torch.Tensor) -> float:
    """‖y − x‖ of two tensors of one shape."""
    if x.numel() <= CHUNK_ELEMENTS:
        return _norm(_as_float(y) - _as_float(x))
    return math.sqrt(sum(_norm64(b - a) ** 2 for a, b in zip(_float_chunks(x), _float_chunks(y))))


def _mean(t: torch.Tensor) -> float:
    """The mean in float64 (`t.double().mean()`), of any dtype."""
    if t.numel() <= CHUNK_ELEMENTS:
        return float(t.double().mean())
    flat = t.detach().reshape(-1)
    total = sum(float(flat[start:start + CHUNK_ELEMENTS].double().sum())
                for start in range(0, flat.numel(), CHUNK_ELEMENTS))
    return total / t.numel()


def _rms(t: torch.Tensor) -> float:
    return _norm(t) / math.sqrt(t.numel()) if t.numel() else 0.0


def _largest_range(x: torch.Tensor, dim: int) -> float:
    """max over the other axes of (max − min along `dim`): one pass for both extremes, the same numbers as
    `amax` and `amin` apart (both are exact)."""
    low, high = torch.aminmax(x, dim=dim)
    return float((high - low).max())


def _nan_max(a: float, b: float) -> float:
    return b if math.isnan(b) or b > a else a


def _max_abs_diff(a: list, b: list, identical: frozenset = frozenset()) -> float:
    """Largest element-wise difference between two outputs; inf when their structure differs. The tensors at the
    indices in `identical` are known equal and finite: they add 0, which changes no maximum."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for index, (x, y) in enumerate(zip(a, b)):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
                worst = math.inf
            continue
        if x.shape != y.shape:
            return math.inf
        if x.numel() and index not in identical:
            for first, second in zip(_float_chunks(x), _float_chunks(y)):
                worst = _nan_max(worst, float((first - second).abs().max()))
    return worst


def _diff_norms(a: list, b: list) -> tuple[float, float, float]:
    """(‖b − a‖, ‖a‖, max|b − a|) over every tensor of the two outputs."""
    if len(a) != len(b) or any(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape != y.shape
                               for x, y in zip(a, b)):
        return math.inf, 0.0, math.inf
    diff_sq = ref_sq = 0.0
    identical = set()
    for index, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.numel():
            ref_norm = _norm(x)
            # A deterministic reference run twice: equal element for element and finite (a finite norm has no inf
            # or NaN in it), every difference is +0, so ‖y − x‖ = 0 and max|y − x| = 0 without computing them.
            if math.isfinite(ref_norm) and x.dtype == y.dtype and torch.equal(x, y):
                identical.add(index)
            else:
                diff_sq += _difference_norm(x, y) ** 2
            ref_sq += ref_norm ** 2
    return math.sqrt(diff_sq), math.sqrt(ref_sq), _max_abs_diff(a, b, frozenset(identical))


_FRACTION_STATS = ("mean", "frac_near_zero", "frac_near_mean")


def _tensor_stats(t, *, fractions: bool = True) -> dict:
    """What the thresholds need from one output tensor: magnitude, the largest range along each axis, and with
    `fractions` the mean and the near-zero and near-mean fractions."""
    if not isinstance(t, torch.Tensor):
        return {"type": type(t).__name__}
    stats = {"shape": list(t.shape), "dtype": str(t.dtype), "numel": t.numel()}
    if not t.numel():
        stats["nonfinite"] = 0
        return stats
    x = _as_float(t)
    chunks = list(_float_chunks(x))
    largest, near_zero = [], {a: 0 for a in NEAR_ATOLS}
    for chunk in chunks:
        magnitude = chunk.abs()
        largest.append(float(magnitude.max()))  # NaN where the chunk has one: max propagates NaN
        for atol in NEAR_ATOLS if fractions else ():
            near_zero[atol] += int(torch.count_nonzero(magnitude <= atol))
        del magnitude
    if not all(math.isfinite(value) for value in largest):
        stats["nonfinite"] = sum(int(torch.count_nonzero(~torch.isfinite(chunk))) for chunk in chunks)
        return stats
    stats["nonfinite"] = 0  # the largest magnitude is finite, so every element is
    stats["max_abs"] = max(largest)
    stats["axis_range"] = [_largest_range(x, d) if size > 1 else None for d, size in enumerate(t.shape)]
    if not fractions:
        return stats
    mean = float(x.mean(dtype=torch.float64)) if x.numel() <= CHUNK_ELEMENTS else _mean(x)
    near_mean = {a: 0 for a in NEAR_ATOLS}
    for chunk in chunks:
        deviation = (chunk - mean).abs_()
        for atol in NEAR_ATOLS:
            near_mean[atol] += int(torch.count_nonzero(deviation <= atol))
        del deviation
    stats["mean"] = mean
    stats["frac_near_zero"] = {repr(a): near_zero[a] / t.numel() for a in NEAR_ATOLS}
    stats["frac_near_mean"] = {repr(a): near_mean[a] / t.numel() for a in NEAR_ATOLS}
    return stats
