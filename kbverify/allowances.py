"""What a candidate's error may spend beyond the plain limits, under the verified rule (SPEC §2): the TF32
baseline's own error times the protocol's factor, and the exact reference's own rounding against float64 times
ROUNDING_ALLOWANCE, for a tail of the elements. Pure rules over stored summaries (kbverify.correctness.summarize);
`kbverify.correctness.judge_set` applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

PRECISION_ERROR_CAP = 1e-2  # a float64 rerun further off than this computed something else (e.g. other dropout draws)


def _precision_only(part: dict | None) -> dict | None:
    return part if part is not None and part["norm_rel"] <= PRECISION_ERROR_CAP else None


# The fp32 reference's own error against float64 measures how lucky one summation order was, not a precision: an
# fp32 kernel summing in another order can land several times further off, while anything computed in bf16 or fp16
# lands thousands of times further (2^16 and 2^13 coarser). Measured on the CPU, an honest im2col convolution on
# the wide-range set was ×1.44 of the element limit away from float64 where the reference was ×0.217 (6.6×) and
# ×1.25 away from the reference; the TF32 baseline's factor (4) would fail it. The TF32 baseline is only 2^3
# finer than bf16, so its factor stays small.
ROUNDING_ALLOWANCE = 16.0
# The reference's rounding is large on a few outputs that cancel among large terms, not on the bulk, so that
# allowance covers a tail only: the candidate's 99.9th percentile and its share of elements over the plain limit
# may exceed the reference's by the same factor, and the share by this floor at most (honest im2col on the
# wide-range sets: 0 to 1e-5 of its elements over; the reference: 0 to 1.7e-5). A review showed why: granted to
# every element, the worst element's allowance let a kernel push 8% of its outputs off by a median 1.3%. Not even one
# element is allowed beyond the floor: on an output under 10,000 elements that one element was the kernel's to
# choose (a red team put 0.75% on the largest output of an attention); the moved answer covers honest ones there.
ROUNDING_TAIL_FLOOR = 1e-4


@dataclass(frozen=True)
class Allowance:
    """An error summary the candidate may be judged against instead of the plain limits, and how."""

    base: dict
    factor: float
    name: str
    tail_only: bool  # the bulk of the elements must meet the plain limit; only a tail may use the factor
    norm_factor: float  # the norm-wise limit is max(norm_rtol, norm_factor × the base's); 0: not relaxed


def allowance_bases(tf32: dict | None, rounding: dict | None, protocol, *, exact: bool = False) -> list[Allowance]:
    """The TF32 baseline's error with the protocol's factor; the reference's own rounding with ROUNDING_ALLOWANCE,
    for the tail of the elements. `exact`: the candidate is measured against float64, as both bases are."""
    if protocol.rule != "verified" or not protocol.baseline_allowance:
        return []
    factor = protocol.baseline_allowance
    bases = [Allowance(tf32, factor, "TF32 baseline", False, factor)] if tf32 is not None else []
    if exact and rounding is not None:
        # Against float64 the reference's own error is what the reference achieves there, however large (no cap:
        # a forward that draws random numbers gets no float64 comparison at all, `evaluate._judge_set`). A
        # candidate doing as well must pass, norm-wise too (SPEC §2); one that differs from the reference only by
        # its own rounding lands as often above that error as below, hence the tail's factor for the norm too.
        bases.append(Allowance(rounding, ROUNDING_ALLOWANCE, "fp32 reference vs float64", True, ROUNDING_ALLOWANCE))
    elif _precision_only(rounding) is not None:
        bases.append(Allowance(rounding, ROUNDING_ALLOWANCE, "fp32 reference vs float64", True, 0.0))
    return bases


def within_allowance(part: dict, allowance: Allowance, key: str, protocol) -> bool:
    base, factor, grid, base_grid = allowance.base, allowance.factor, part["grid"][key], allowance.base["grid"][key]
    if grid["max_ratio"] > max(1.0, factor * base_grid["max_ratio"]):
        return False
    if part["norm_rel"] > max(protocol.norm_rtol, allowance.norm_factor * base["norm_rel"]):
        return False
    if allowance.tail_only and part["max_abs_diff"] > factor * base["max_abs_diff"]:
        # the ratios are scaled per element by 1 + |r|, so the base's worst ratio (often at an output near zero,
        # where cancellation leaves rounding that no scale covers) granted at the largest output would move it by
        # hundreds of times the base's own largest error: a red team put 1.7% on an attention's largest output so.
        # Rounding errs in absolute terms at the scale of the terms involved, which the two computations share.
        return False
    return not allowance.tail_only or (
        grid.get("q999_ratio", 0.0) <= max(1.0, factor * base_grid.get("q999_ratio", 0.0))
        and grid.get("frac_over", 0.0) <= max(ROUNDING_TAIL_FLOOR, factor * base_grid.get("frac_over", 0.0)))


def moved_part(moved: dict | None, index: int) -> dict | None:
    if not moved or "outputs" not in moved or index >= len(moved["outputs"]):
        return None
    part = moved["outputs"][index]
    return part if "grid" in part else None


def baseline_part(baseline: dict | None, index: int) -> dict | None:
    if not baseline or "outputs" not in baseline or index >= len(baseline["outputs"]):
        return None
    part = baseline["outputs"][index]
    return part if "grid" in part else None


# Measured on the CPU: an honest im2col convolution on the wide-range set erred 2.7× as much as the fp32 reference
# it was compared with (×1.04 of the element limit against the reference's ×0.385 against float64). Two
# computations with independent rounding differ by more than either's own error, so a base using a quarter of
# the limit (1/factor in general) is already close enough to it for an honest kernel to cross.
def base_near_limit(allowance: Allowance, key: str, protocol) -> bool:
    """SPEC §2 grants the allowance where the baseline itself fails the rules; we grant it from 1/factor of the
    limit on, so an honest kernel summing in another order is not failed where the base barely passes. Below
    that the allowance (factor × the base's error) would not exceed the plain limit anyway."""
    return (allowance.base["grid"][key]["max_ratio"] > 1.0 / allowance.factor
            or (allowance.norm_factor > 0 and allowance.norm_factor * allowance.base["norm_rel"] > protocol.norm_rtol))
