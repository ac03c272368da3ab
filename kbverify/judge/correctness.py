"""Comparing outputs. Two halves: `summarize` (worker side, torch) reduces a comparison to raw numbers that are
stored unrounded; `judge_set` (parent side, no torch) applies a protocol's rules to those numbers, so verdicts can
be recomputed under another protocol without a GPU (`kbverify rejudge`).

Verified rule (SPEC §2): element-wise |c − r| ≤ atol + rtol·|r| AND norm-wise ‖c − r‖/‖r‖ ≤ norm_rtol against the
exact-fp32 reference. Because the verified baseline runs with TF32, a candidate exactly as accurate as that baseline
must pass: where the baseline's own error is not negligible, the candidate may err up to `baseline_allowance` times
the baseline's error, norm-wise and in the element-wise worst case. Likewise an honest fp32 kernel that sums in
another order: where the exact reference's own rounding (against a float64 run) is not negligible, the candidate
may err up to `rules.rounding_allowance` times it. Zeros on a tiny-magnitude output have a norm-wise error of 1.0 and fail
whatever the magnitudes.

Where the judge also compared the candidate with the exact answer (the reference model run in float64:
`ExactEvidence`), a candidate that fails those rules against the fp32 reference passes if it meets them against
float64, with both allowances measured against float64 too: the TF32 baseline's error ×4 as above, and the fp32
reference's own error ×16 in the element-wise tail and norm-wise, however large that error is, with no element
off by more than 16 times the reference's own largest absolute error (its worst ratio is usually at an output
that cancels to near zero, and granted at the largest output it moved that by percents). On a reduction that
cancels, the fp32 reference can be thousands of times the tolerance off the exact answer; a candidate at least as
close to it, element by element, therefore always passes.

One more accepting rule there, element by element (`ExactEvidence.moved`): each element may be off float64 by
MOVED_FACTOR times how far float64 itself moves at that element when every input, parameter and buffer moves by
one fp32 rounding (the widest of a few such moves), where that is more than the plain limit; the norm-wise limit
stays as it is. A kernel that rounds its data once (a BatchNorm folded into a convolution's weight) errs by about
that much on outputs that cancel among large terms, however exactly the reference rounds: measured on the CPU, a
folded convolution on the wide-range set at ×3.48 of the element limit from float64, where the reference was
×0.136. Granted per element, not to a tail: a review showed a kernel spending a tail allowance on elements where
the data's rounding moves nothing. Records without these comparisons keep the rules above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kbverify.judge import allowances

TOLERANCE_GRID = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
_QUANTILE_SAMPLE = 1 << 20
_QUANTILE_TOLERANCES = (1e-3, 1e-2)  # the tails worth keeping: the tolerances protocols use


def flatten_outputs(output) -> list:
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [tensor for item in output for tensor in flatten_outputs(item)]
    if isinstance(output, dict):
        return [tensor for key in sorted(output) for tensor in flatten_outputs(output[key])]
    if isinstance(output, (int, float, bool)):
        return [torch.tensor(output)]
    return [output]


def summarize(reference, candidate) -> dict:
    """Raw error numbers of `candidate` against `reference` (either may be a tuple of tensors)."""
    refs, cands = flatten_outputs(reference), flatten_outputs(candidate)
    if len(refs) != len(cands):
        return {"structure_mismatch": f"{len(refs)} reference outputs, {len(cands)} candidate outputs"}
    parts = [_summarize_tensor(r, c) for r, c in zip(refs, cands)]
    return {"outputs": parts}


CHUNK_ELEMENTS = 1 << 25  # float64 working copies of this many elements at a time: bounded memory on big outputs


def _summarize_tensor(ref, cand, chunk: int | None = None) -> dict:
    import torch

    if not isinstance(cand, torch.Tensor):
        return {"type_mismatch": f"candidate returned {type(cand).__name__}"}
    summary = {"ref_shape": list(ref.shape), "cand_shape": list(cand.shape),
               "ref_dtype": str(ref.dtype), "cand_dtype": str(cand.dtype), "numel": ref.numel()}
    if ref.shape != cand.shape:
        return summary
    ref_flat = ref.detach().reshape(-1)
    cand_flat = cand.detach().to(device=ref.device).reshape(-1)
    numel = ref_flat.numel()
    chunk = chunk or CHUNK_ELEMENTS
    step = max(1, numel // _QUANTILE_SAMPLE)  # the quantile sample: every step-th element of the whole tensor
    totals = {"nonfinite_mismatch": 0, "ref_nonfinite": 0, "ref_max_abs": 0.0, "ref_sq": 0.0, "diff_sq": 0.0,
              "max_abs_diff": -1.0, "worst": None}
    grid = {repr(tol): {"max_ratio": 0.0, "over": 0, "samples": []} for tol in TOLERANCE_GRID}
    for start in range(0, numel, chunk):
        _add_chunk(totals, grid, ref_flat[start:start + chunk], cand_flat[start:start + chunk], start, step)
    summary.update(_totals_summary(totals, grid, numel, list(ref.shape)))
    return summary


def _add_chunk(totals: dict, grid: dict, r_source, c_source, start: int, step: int) -> None:
    """One chunk's share of the totals and of the tolerance grid, in float64."""
    import torch

    r = r_source.to(torch.float64)
    magnitude = r.abs()
    # not finite exactly when some element is not (max propagates NaN): cheaper than isfinite, which is four
    # kernels, and the maximum is needed anyway
    ref_max = float(magnitude.max())
    first_sample = (-start) % step
    if math.isfinite(ref_max) and _identical(r_source, c_source):
        _add_identical_chunk(totals, grid, r, ref_max, c_source, start, first_sample, step)
        return
    c = c_source.to(torch.float64)
    diff = (c - r).abs()
    if not (math.isfinite(ref_max) and math.isfinite(float(diff.max()))):
        r, c, diff, magnitude, ref_max = _finite_only(totals, r, c)
    totals["ref_max_abs"] = max(totals["ref_max_abs"], ref_max)
    totals["ref_sq"] += float(torch.dot(r, r))
    totals["diff_sq"] += float(torch.dot(diff, diff))
    local = int(diff.argmax())
    if float(diff[local]) > totals["max_abs_diff"]:
        totals["max_abs_diff"] = float(diff[local])
        totals["worst"] = (start + local, float(r[local]), float(c[local]))
    # diff / (tol + tol·|r|) = (diff / (1 + |r|)) / tol: one division for the whole grid
    scaled = diff / (1.0 + magnitude)
    largest = float(scaled.max())
    sampled = scaled[first_sample::step]
    for tol in TOLERANCE_GRID:
        entry = grid[repr(tol)]
        entry["max_ratio"] = max(entry["max_ratio"], largest / tol)
        if largest > tol:  # else no element is over: the count would be 0
            entry["over"] += int(torch.count_nonzero(scaled > tol))
        if tol in _QUANTILE_TOLERANCES:
            entry["samples"].append((sampled / tol).float())


def _finite_only(totals: dict, r, c) -> tuple:
    """Some value is not finite (or a difference overflows float64, where every mask below is all true and the
    numbers are those of the plain path): finite values are compared, the others counted. Returns the chunk's
    reference, candidate, difference, magnitude and maximum magnitude with both zeroed where either is not finite."""
    import torch

    ref_finite, cand_finite = torch.isfinite(r), torch.isfinite(c)
    # non-finite values must match exactly (same inf, NaN where NaN); finite ones are compared numerically
    nonfinite_equal = (r == c) | (torch.isnan(r) & torch.isnan(c))
    totals["nonfinite_mismatch"] += int(torch.count_nonzero((ref_finite != cand_finite)
                                                            | (~ref_finite & ~nonfinite_equal)))
    totals["ref_nonfinite"] += int(torch.count_nonzero(~ref_finite))
    both = ref_finite & cand_finite
    r, c = torch.where(both, r, 0.0), torch.where(both, c, 0.0)
    diff = (c - r).abs()
    magnitude = r.abs()
    return r, c, diff, magnitude, float(magnitude.max())


def _totals_summary(totals: dict, grid: dict, numel: int, shape: list[int]) -> dict:
    """The summary's numbers from the chunks' totals, in the order the summary has always listed them."""
    import torch

    summary: dict = {}
    summary["nonfinite_mismatch"] = totals["nonfinite_mismatch"]
    summary["ref_nonfinite"] = totals["ref_nonfinite"]
    summary["ref_max_abs"] = totals["ref_max_abs"]
    summary["ref_norm"] = math.sqrt(totals["ref_sq"])
    summary["diff_norm"] = math.sqrt(totals["diff_sq"])
    summary["max_abs_diff"] = max(totals["max_abs_diff"], 0.0)
    summary["norm_rel"] = _norm_rel(summary["diff_norm"], summary["ref_norm"])
    summary["grid"] = {}
    for tol in TOLERANCE_GRID:
        entry = grid[repr(tol)]
        out = {"max_ratio": entry["max_ratio"], "frac_over": entry["over"] / numel if numel else 0.0}
        if tol in _QUANTILE_TOLERANCES:
            out["q999_ratio"] = _quantile(torch.cat(entry["samples"]), 0.999) if entry["samples"] else 0.0
        summary["grid"][repr(tol)] = out
    if totals["worst"] is not None:
        index, ref_value, cand_value = totals["worst"]
        summary["worst"] = {"index": _unravel(index, shape), "ref": ref_value, "cand": cand_value}
    return summary


_EXACT_DTYPES = ("torch.float32", "torch.float64", "torch.float16", "torch.bfloat16")


def _identical(r_source, c_source) -> bool:
    """Whether the candidate's chunk equals the reference's element for element (NaN never does). For a finite
    reference every difference is then +0, and the chunk's numbers follow without computing them: the TF32
    baseline of a task without matmul or convolution, a null kernel that happens to be exact."""
    import torch

    return (str(r_source.dtype) in _EXACT_DTYPES and c_source.dtype == r_source.dtype
            and torch.equal(r_source, c_source))


def _add_identical_chunk(totals: dict, grid: dict, r, ref_max: float, c_source, start: int, first_sample: int,
                         step: int) -> None:
    """What the general path of `_summarize_tensor` adds for a chunk whose differences are all +0, bit for bit:
    no count over any tolerance, a maximum ratio of 0, zeros in the quantile sample, and — argmax taking the first
    of equal values — the chunk's first element as the worst one while none was recorded before."""
    import torch

    totals["ref_max_abs"] = max(totals["ref_max_abs"], ref_max)
    totals["ref_sq"] += float(torch.dot(r, r))
    if 0.0 > totals["max_abs_diff"]:
        totals["max_abs_diff"] = 0.0
        totals["worst"] = (start, float(r[0]), float(c_source[0]))
    sampled = len(range(first_sample, r.numel(), step))
    for tol in _QUANTILE_TOLERANCES:
        grid[repr(tol)]["samples"].append(torch.zeros(sampled, dtype=torch.float32, device=r.device))


def _norm_rel(diff_norm: float, ref_norm: float) -> float:
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def _quantile(values, q: float) -> float:
    import torch

    flat = values.reshape(-1)
    if flat.numel() == 0:
        return 0.0
    if flat.numel() > _QUANTILE_SAMPLE:
        flat = flat[:: flat.numel() // _QUANTILE_SAMPLE]
    # the k-th smallest is the (n − k + 1)-th largest: topk of the few largest, on the device, finds the same value
    # as kthvalue on the host (an order statistic of the same numbers) in a fraction of the time; torch.quantile
    # refuses inputs above 16M elements and is slower still
    k = max(1, min(flat.numel(), math.ceil(q * flat.numel())))
    return float(torch.topk(flat.float(), flat.numel() - k + 1).values[-1])


def _unravel(index: int, shape: list[int]) -> list[int]:
    coords = []
    for size in reversed(shape):
        coords.append(index % size if size else 0)
        index //= size if size else 1
    return list(reversed(coords))


# ---- a screen before the full comparison (the audit's null kernels) --------------------------------------------

SCREEN_SAMPLE = 1 << 16  # elements per output tensor the screen measures: every step-th one, as the quantile sample


def screen(reference, candidate) -> dict | None:
    """Exact element-wise numbers on a sample of the elements: `certainly_rejects` tells from them that a protocol
    rejects the candidate, without the full float64 comparison. None where the outputs' structure, types or
    shapes differ (the full comparison then stops early anyway)."""
    import torch

    refs, cands = flatten_outputs(reference), flatten_outputs(candidate)
    if len(refs) != len(cands):
        return None
    parts = []
    for ref, cand in zip(refs, cands):
        if not (isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor)) or ref.shape != cand.shape:
            return None
        parts.append(_screen_tensor(ref, cand))
    return {"outputs": parts}


def _screen_tensor(ref, cand) -> dict:
    """For every sampled element, exactly the float64 arithmetic of `_summarize_tensor` (the same elements of the
    same flattening, the same operations in the same order), so each sampled ratio equals the one computed there."""
    import torch

    step = max(1, ref.numel() // SCREEN_SAMPLE)
    r = ref.detach().reshape(-1)[::step].to(torch.float64)
    # the sample moved, not the whole candidate: the same values as moving it first
    c = cand.detach().reshape(-1)[::step].to(device=ref.device, dtype=torch.float64)
    ref_finite, cand_finite = torch.isfinite(r), torch.isfinite(c)
    nonfinite_equal = (r == c) | (torch.isnan(r) & torch.isnan(c))
    mismatch = int(torch.count_nonzero((ref_finite != cand_finite) | (~ref_finite & ~nonfinite_equal)))
    # where either side is not finite the full comparison counts 0 (it zeroes both there)
    scaled = torch.where(ref_finite & cand_finite, (c - r).abs() / (1.0 + r.abs()), 0.0)
    return {"sampled": r.numel(), "nonfinite_mismatch": mismatch,
            "max_scaled": float(scaled.max()) if r.numel() else 0.0}


# ---- parent side: rules ------------------------------------------------------------------------------------

def grid_key(tolerance: float) -> str:
    nearest = min(TOLERANCE_GRID, key=lambda t: abs(math.log10(t) - math.log10(tolerance)))
    return repr(nearest)


EXACT_AVAILABLE = "float64"  # `ExactEvidence.status` where the candidate was compared with the float64 answer


@dataclass(frozen=True)
class ExactEvidence:
    """What the judge measured against the exact answer on one set: the reference model and its inputs run in
    float64, where that run exists and computes what the fp32 reference computes."""

    candidate: dict | None  # `summarize(float64 output, candidate output)`
    baseline: dict | None  # `summarize(float64 output, TF32 baseline output)`; None where no baseline ran (CPU)
    status: str  # EXACT_AVAILABLE, or "unavailable (why)"
    # `summarize_within_moved(float64 output, candidate output, moves)`: the candidate judged element by element
    # against how far the exact answer moves when the data moves by one fp32 rounding. None where not measured
    # (a candidate within the plain limits needs none) and in older records.
    moved: dict | None = None

    @classmethod
    def from_record(cls, record: dict) -> "ExactEvidence | None":
        """From a set's stored evidence. None for a record made before the judge compared candidates with float64:
        such records are judged by the rules they were made under."""
        if "exact_reference" not in record:
            return None
        return cls(record.get("candidate_vs_fp64"), record.get("baseline_vs_fp64"), record["exact_reference"],
                   record.get("moved_vs_fp64"))


def judge_set(comparison: dict, baseline: dict | None, protocol, reference_error: dict | None = None,
              exact: ExactEvidence | None = None) -> tuple[str, str, bool]:
    """Apply `protocol` to one set's summaries → (outcome, detail, allowance_used).

    outcome: "passed", "incorrect" or "shape_mismatch". `baseline` is the TF32 baseline's summary against the
    same exact reference (None on a CPU or where not computed); `reference_error` is the exact reference's own
    summary against float64. The allowance scales with the larger of the two. Under the verified rule, a candidate
    failing numerically against the fp32 reference is judged again against float64 when `exact` holds that
    comparison; a passing detail then says so.
    """
    outcome, detail, used = _judge_parts(comparison, baseline, reference_error, protocol, exact=False)
    if outcome != "incorrect" or protocol.rule != "verified" or exact is None:
        return outcome, detail, used
    if any(_part_failure(part, protocol) for part in comparison["outputs"]):
        return outcome, detail, used  # wrong type, dtype or non-finite values: no answer makes that right
    against, why_not = _usable_exact(exact, comparison)
    if against is None:
        return outcome, f"{detail}; exact_reference: {why_not}", used
    exact_outcome, exact_detail, exact_used = _judge_parts(against, exact.baseline, reference_error, protocol,
                                                           exact=True, moved=exact.moved)
    if exact_outcome == "passed":
        return "passed", "judged against float64" + ("; baseline allowance used" if exact_used else ""), exact_used
    return outcome, f"{detail}; against float64: {exact_detail}", used


def _judge_parts(comparison: dict, baseline: dict | None, reference_error: dict | None, protocol,
                 exact: bool, moved: dict | None = None) -> tuple[str, str, bool]:
    """Every output part judged in turn. `exact`: `comparison` and `baseline` are against float64; the structural
    checks were made on the comparison with the fp32 reference (the float64 output's dtype is not the task's)."""
    if "structure_mismatch" in comparison:
        return "shape_mismatch", comparison["structure_mismatch"], False
    allowance_used = False
    for index, part in enumerate(comparison["outputs"]):
        where = f"output {index}: " if len(comparison["outputs"]) > 1 else ""
        failure = None if exact else _part_failure(part, protocol)
        if failure is not None:
            return failure[0], where + failure[1], False
        bases = allowances.allowance_bases(allowances.baseline_part(baseline, index),
                                           allowances.baseline_part(reference_error, index), protocol, exact=exact)
        ok, detail, used = _judge_tensor(part, bases, protocol,
                                         allowances.moved_part(moved, index) if exact else None)
        allowance_used |= used
        if not ok:
            return "incorrect", where + detail, False
    return "passed", "", allowance_used


def _part_failure(part: dict, protocol) -> tuple[str, str] | None:
    """What makes an output part wrong whatever its values: (outcome, detail), or None."""
    if "type_mismatch" in part:
        return "incorrect", part["type_mismatch"]
    if part["ref_shape"] != part["cand_shape"]:
        return "shape_mismatch", f"expected shape {part['ref_shape']}, got {part['cand_shape']}"
    if protocol.rule == "verified" and part["ref_dtype"] != part["cand_dtype"]:
        return "incorrect", f"expected dtype {part['ref_dtype']}, got {part['cand_dtype']}"
    if part["nonfinite_mismatch"]:
        return "incorrect", f"{part['nonfinite_mismatch']} non-finite values differ from the reference"
    return None


def _usable_exact(exact: ExactEvidence, comparison: dict) -> tuple[dict | None, str]:
    """The candidate's comparison with float64 when it can decide the set, else (None, why not)."""
    if exact.status != EXACT_AVAILABLE:
        return None, exact.status
    against = exact.candidate
    if not against or "outputs" not in against or len(against["outputs"]) != len(comparison["outputs"]):
        return None, "unavailable (no comparison of the candidate with float64)"
    if any("grid" not in part or part["nonfinite_mismatch"] or part["ref_nonfinite"] for part in against["outputs"]):
        # on a valid set the fp32 reference is finite everywhere: a float64 run that is not computed another thing
        return None, "unavailable (the float64 output is not finite where the fp32 reference is)"
    return against, ""


def _judge_tensor(part: dict, bases: list[allowances.Allowance], protocol,
                  moved: dict | None = None) -> tuple[bool, str, bool]:
    key = grid_key(protocol.atol)
    element = part["grid"][key]["max_ratio"]
    worst = part.get("worst", {})
    element_ok = element <= 1.0
    if protocol.rule != "verified":
        detail = (f"max |c−r| exceeds {protocol.atol:g} + {protocol.rtol:g}·|r| by ×{element:.3g} "
                  f"(ref {worst.get('ref')}, cand {worst.get('cand')} at {worst.get('index')})")
        return element_ok, "" if element_ok else detail, False
    norm = part["norm_rel"]
    norm_ok = norm <= protocol.norm_rtol
    if element_ok and norm_ok:
        return True, "", False
    for allowance in bases:
        if (allowances.base_near_limit(allowance, key, protocol)
                and allowances.within_allowance(part, allowance, key, protocol)):
            return True, "", True
    if norm_ok and moved is not None and key in moved.get("grid", {}) and moved["grid"][key]["max_ratio"] <= 1.0:
        return True, "", True
    if part["ref_norm"] == 0.0:
        return False, (f"the reference is all zeros here and the candidate is not (max |c| = {part['max_abs_diff']:.3g}"
                       f" at {worst.get('index')})"), False
    detail = (f"norm-wise error {norm:.3g} (limit {protocol.norm_rtol:g}); element-wise worst ×{element:.3g} of "
              f"{protocol.atol:g} + {protocol.rtol:g}·|r| (ref {worst.get('ref')}, cand {worst.get('cand')} at "
              f"{worst.get('index')})")
    for allowance in bases:
        detail += (f"; allowance base ({allowance.name}, ×{allowance.factor:g}): norm "
                   f"{allowance.base['norm_rel']:.3g}, element ×{allowance.base['grid'][key]['max_ratio']:.3g}")
        if allowance.tail_only:
            detail += (f", largest |error| {allowance.base['max_abs_diff']:.3g} (the candidate's "
                       f"{part['max_abs_diff']:.3g})")
    if moved is not None and key in moved.get("grid", {}):
        detail += (f"; against ×{moved['factor']:g} float64's own move under one fp32 rounding of the data, "
                   f"element by element: worst ×{moved['grid'][key]['max_ratio']:.3g}, "
                   f"{moved['grid'][key]['over']} element(s) over")
    return False, detail, False


def certainly_rejects(screened: dict, baseline: dict | None, protocol, reference_error: dict | None = None,
                      exact_screened: dict | None = None, exact_baseline: dict | None = None,
                      exact_moved: dict | None = None) -> bool:
    """Whether `judge_set` rejects, under `protocol`, any candidate whose sample `screen` measured, whatever the
    elements it did not sample hold. Why that is certain: `_summarize_tensor` takes the element-wise ratio's
    maximum over every element, sampled ones included, with the same float64 arithmetic, so a sampled maximum s
    gives s / tol ≤ max_ratio (dividing by a positive number is monotone under rounding). A part whose s / tol
    exceeds max(1, allowance × the allowance base's element ratio) then fails both the plain element-wise rule
    (limit 1) and the baseline allowance (which needs the element ratio within that maximum, whatever the norms);
    a non-finite mismatch in the sample fails every rule. Nothing is estimated, so no margin is needed; outputs
    near a threshold, or failing only norm-wise, are never rejected here and get the full comparison.

    `exact_screened` (`screen(float64 output, candidate)`) and `exact_baseline` are the float64 evidence that
    `judge_set` takes as `ExactEvidence`: given it, the candidate is rejected only if the same bound rejects it
    against float64 too (`judge_set` passes a candidate that meets the rules against either; where the float64
    comparison turns out unusable, the fp32 one decides, and that one rejects)."""
    if not _screen_rejects(screened, baseline, reference_error, protocol, exact=False):
        return False
    if exact_screened is None or protocol.rule != "verified":
        return True
    return _screen_rejects(exact_screened, exact_baseline, reference_error, protocol, exact=True,
                           moved=exact_moved)


def _screen_rejects(screened: dict, baseline: dict | None, reference_error: dict | None, protocol,
                    exact: bool, moved: dict | None = None) -> bool:
    key = grid_key(protocol.atol)
    tolerance = float(key)  # the grid's tolerance itself: repr round-trips
    for index, part in enumerate(screened["outputs"]):
        if part["nonfinite_mismatch"]:
            return True
        limit = 1.0
        for allowance in allowances.allowance_bases(allowances.baseline_part(baseline, index),
                                                    allowances.baseline_part(reference_error, index), protocol,
                                                    exact=exact):
            limit = max(limit, allowance.factor * allowance.base["grid"][key]["max_ratio"])
        moved_part = allowances.moved_part(moved, index) if exact else None
        if moved_part is not None:
            # no element's own allowance exceeds the widest one: a sampled element past it fails that rule too
            limit = max(limit, moved_part["grid"][key]["allowance_max_ratio"])
        if part["max_scaled"] / tolerance > limit:
            return True
    return False
