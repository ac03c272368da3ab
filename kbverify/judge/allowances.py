"""What a candidate's error may spend beyond the plain limits, under the verified rule (SPEC §2): the TF32
baseline's own error times the protocol's factor, and the exact reference's own rounding against float64 times
`rules.rounding_allowance`, for a tail of the elements (kbverify.core.rules). Pure rules over stored summaries
(kbverify.judge.correctness.summarize); `kbverify.judge.correctness.judge_set` applies them.
"""

from __future__ import annotations

from dataclasses import dataclass


def _precision_only(part: dict | None, rules) -> dict | None:
    return part if part is not None and part["norm_rel"] <= rules.precision_error_cap else None


@dataclass(frozen=True)
class Allowance:
    """An error summary the candidate may be judged against instead of the plain limits, and how."""

    base: dict
    factor: float
    name: str
    tail_only: bool  # the bulk of the elements must meet the plain limit; only a tail may use the factor
    norm_factor: float  # the norm-wise limit is max(norm_rtol, norm_factor × the base's); 0: not relaxed


def allowance_bases(tf32: dict | None, rounding: dict | None, protocol, *, exact: bool = False) -> list[Allowance]:
    """The TF32 baseline's error with the protocol's factor; the reference's own rounding with the rounding allowance,
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
        rounding_factor = protocol.rules.rounding_allowance
        bases.append(Allowance(rounding, rounding_factor, "fp32 reference vs float64", True, rounding_factor))
    elif _precision_only(rounding, protocol.rules) is not None:
        bases.append(Allowance(rounding, protocol.rules.rounding_allowance, "fp32 reference vs float64", True, 0.0))
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
        # hundreds of times the base's own largest error (corpus qkv_attention_spends_one_element_tail).
        # Rounding errs in absolute terms at the scale of the terms involved, which the two computations share.
        return False
    return not allowance.tail_only or (
        grid.get("q999_ratio", 0.0) <= max(1.0, factor * base_grid.get("q999_ratio", 0.0))
        and grid.get("frac_over", 0.0) <= max(protocol.rules.rounding_tail_floor, factor * base_grid.get("frac_over", 0.0)))


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
