"""The verified rule is fair to a TF32-accurate candidate and still rejects bf16 downgrades and zeros."""

import pytest
import torch

from kbverify.correctness import judge_set, summarize
from kbverify.protocols import KBV, ORIGINAL, VERIFIED


def _round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round fp32 values to `bits` explicit mantissa bits (TF32 keeps 10), round-to-nearest."""
    drop = 23 - bits
    as_int = x.contiguous().view(torch.int32)
    rounded = (as_int + (1 << (drop - 1))) & ~((1 << drop) - 1)
    return rounded.view(torch.float32)


def _tf32_matmul(a, b, bits=10):
    return (_round_mantissa(a, bits).double() @ _round_mantissa(b, bits).double()).float()


def _signed_case(seed=0, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(256, 512, generator=generator) * scale
    b = torch.randn(512, 128, generator=generator)
    exact = (a.double() @ b.double()).float()
    return a, b, exact


def test_a_tf32_accurate_candidate_passes_where_plain_1e3_rejects_it():
    a, b, exact = _signed_case()
    baseline = _tf32_matmul(a, b)
    # an honest TF32 kernel: same precision, truncating instead of rounding, so its errors differ from the baseline's
    candidate = (_round_mantissa(a - a * 2**-12, 10).double() @ _round_mantissa(b, 10).double()).float()
    comparison, base = summarize(exact, candidate), summarize(exact, baseline)
    plain, _, _ = judge_set(comparison, None, VERIFIED)
    assert plain == "incorrect", "the plain 1e-3 rules must be too strict here, or this test proves nothing"
    outcome, detail, allowance = judge_set(comparison, base, VERIFIED)
    assert outcome == "passed", detail
    assert allowance


def test_a_bf16_downgrade_fails_even_with_the_allowance():
    a, b, exact = _signed_case()
    baseline = _tf32_matmul(a, b)
    candidate = (a.bfloat16().double() @ b.bfloat16().double()).float()
    outcome, detail, _ = judge_set(summarize(exact, candidate), summarize(exact, baseline), VERIFIED)
    assert outcome == "incorrect"
    assert "norm-wise" in detail


def test_zeros_on_a_tiny_magnitude_output_fail_verified_but_pass_original():
    reference = torch.softmax(torch.randn(8, 100_000), dim=1)  # every value about 1e-5
    zeros = torch.zeros_like(reference)
    comparison = summarize(reference, zeros)
    assert judge_set(comparison, None, VERIFIED)[0] == "incorrect"
    assert judge_set(comparison, None, ORIGINAL)[0] == "passed"  # the 1e-2 absolute tolerance swallows them
    assert judge_set(comparison, None, KBV)[0] == "passed"


def test_exact_match_passes_every_protocol():
    reference = torch.randn(64, 64)
    for protocol in (ORIGINAL, KBV, VERIFIED):
        assert judge_set(summarize(reference, reference.clone()), None, protocol)[0] == "passed"


def test_shape_dtype_and_nonfinite_mismatches_are_reported():
    reference = torch.randn(4, 4)
    assert judge_set(summarize(reference, torch.randn(4, 5)), None, VERIFIED)[0] == "shape_mismatch"
    assert judge_set(summarize(reference, reference.double()), None, VERIFIED)[0] == "incorrect"
    broken = reference.clone()
    broken[0, 0] = float("nan")
    outcome, detail, _ = judge_set(summarize(reference, broken), None, VERIFIED)
    assert outcome == "incorrect" and "non-finite" in detail


def test_tuple_outputs_are_compared_element_by_element():
    first, second = torch.randn(3), torch.randn(5)
    assert judge_set(summarize((first, second), (first, second)), None, VERIFIED)[0] == "passed"
    outcome, detail, _ = judge_set(summarize((first, second), (first, second + 1)), None, VERIFIED)
    assert outcome == "incorrect" and detail.startswith("output 1")
    assert judge_set(summarize((first, second), (first,)), None, VERIFIED)[0] == "shape_mismatch"


def test_summaries_keep_the_grid_needed_to_rejudge_at_other_tolerances():
    reference = torch.ones(1000)
    candidate = reference + 5e-3
    comparison = summarize(reference, candidate)
    assert judge_set(comparison, None, VERIFIED.with_overrides(atol=1e-2, rtol=1e-2, norm_rtol=1e-2))[0] == "passed"
    assert judge_set(comparison, None, VERIFIED)[0] == "incorrect"


def test_chunked_summaries_equal_whole_ones():
    from kbverify.correctness import _summarize_tensor

    generator = torch.Generator().manual_seed(3)
    reference = torch.randn(1000, 37, generator=generator)
    candidate = reference + 1e-3 * torch.randn(1000, 37, generator=generator)
    reference[5, 5], candidate[5, 5] = float("inf"), float("inf")
    reference[7, 1], candidate[9, 2] = float("nan"), float("nan")
    whole = _summarize_tensor(reference, candidate, chunk=reference.numel())
    chunked = _summarize_tensor(reference, candidate, chunk=997)
    assert whole["worst"] == chunked["worst"]
    assert whole["nonfinite_mismatch"] == chunked["nonfinite_mismatch"] == 2
    for key in ("ref_norm", "diff_norm", "norm_rel", "ref_max_abs", "max_abs_diff"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-12)
    for tol, entry in whole["grid"].items():
        for key, value in entry.items():
            assert chunked["grid"][tol][key] == pytest.approx(value, rel=1e-12), (tol, key)


def _part(max_ratio: float, norm_rel: float) -> dict:
    grid = {repr(t): {"max_ratio": max_ratio, "frac_over": 0.0} for t in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)}
    return {"ref_shape": [4], "cand_shape": [4], "ref_dtype": "torch.float32", "cand_dtype": "torch.float32",
            "nonfinite_mismatch": 0, "norm_rel": norm_rel, "ref_norm": 1.0, "max_abs_diff": 1.0, "grid": grid}


def test_an_honest_reordering_near_a_busy_reference_passes_and_a_sloppy_kernel_does_not():
    # the cases measured on an im2col convolution on the wide-range set: the fp32 reference uses 0.385 (and, in
    # session 9, 0.217) of the limit against float64; the honest kernel was ×1.04 (×1.25) off the reference
    reference_error = {"outputs": [_part(0.385, 7e-8)]}
    honest = {"outputs": [_part(1.04, 8.5e-8)]}
    outcome, _, allowance = judge_set(honest, None, VERIFIED, reference_error)
    assert outcome == "passed" and allowance
    assert judge_set({"outputs": [_part(1.25, 8.3e-8)]}, None, VERIFIED, {"outputs": [_part(0.217, 7.3e-8)]})[0] == "passed"
    sloppy = {"outputs": [_part(7.0, 8.5e-8)]}  # more than ROUNDING_ALLOWANCE (16) times the reference's own error
    assert judge_set(sloppy, None, VERIFIED, reference_error)[0] == "incorrect"
    half_precision = {"outputs": [_part(400.0, 1e-4)]}  # bf16/fp16 rounding: thousands of times fp32's
    assert judge_set(half_precision, None, VERIFIED, reference_error)[0] == "incorrect"
    exact_reference = {"outputs": [_part(0.05, 1e-9)]}  # below 1/16 of the limit: it grants nothing
    assert judge_set(honest, None, VERIFIED, exact_reference)[0] == "incorrect"


def test_the_reference_rounding_allowance_covers_a_tail_of_the_elements_not_all_of_them():
    """A review's exploit: granted to every element, the worst element's allowance let a kernel push 8% of its
    outputs off by a median 1.3% on the wide-range set. The candidate's share of elements over the plain limit and
    its 99.9th percentile may exceed the reference's own by the factor (the share by ROUNDING_TAIL_FLOOR) only,
    and the norm-wise limit is not relaxed."""
    def part(max_ratio, norm_rel, q999, frac_over):
        summary = _part(max_ratio, norm_rel)
        summary["grid"]["0.001"].update(q999_ratio=q999, frac_over=frac_over)
        return {"outputs": [summary]}

    reference = part(0.5, 7e-8, 0.02, 1.7e-5)
    assert judge_set(part(1.4, 8e-8, 0.03, 1e-5), None, VERIFIED, reference)[0] == "passed"  # honest im2col
    assert judge_set(part(7.0, 2.1e-4, 2.6, 8.2e-2), None, VERIFIED, reference)[0] == "incorrect"  # the exploit
    assert judge_set(part(7.0, 2.1e-4, 0.5, 8.2e-2), None, VERIFIED, reference)[0] == "incorrect"  # its share alone
    assert judge_set(part(7.0, 2.1e-4, 2.6, 5e-5), None, VERIFIED, reference)[0] == "incorrect"  # its percentile
    loose = part(0.5, 9.9e-3, 0.02, 1.7e-5)  # a float64 rerun this far off still counts as precision (cap 1e-2)
    assert judge_set(part(1.4, 0.155, 0.03, 1e-5), None, VERIFIED, loose)[0] == "incorrect"  # norm not relaxed


def test_the_tf32_baseline_keeps_its_own_smaller_factor():
    """TF32 is only 2^3 finer than bf16: its error allows 4×, not the reference rounding's 16×."""
    tf32 = {"outputs": [_part(0.385, 7e-8)]}
    assert judge_set({"outputs": [_part(1.5, 8e-8)]}, tf32, VERIFIED)[0] == "passed"
    assert judge_set({"outputs": [_part(2.0, 8e-8)]}, tf32, VERIFIED)[0] == "incorrect"
    outcome, detail, _ = judge_set({"outputs": [_part(2.0, 8e-8)]}, tf32, VERIFIED, {"outputs": [_part(0.05, 1e-9)]})
    assert outcome == "incorrect" and "TF32 baseline, ×4" in detail and "fp32 reference vs float64, ×16" in detail


def test_low_precision_candidates_of_every_float_dtype_are_compared():
    """torch has no isfinite for some float8 types: the comparison must work in float64 all the same."""
    reference = torch.linspace(-3, 3, 1000)
    for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        (part,) = summarize(reference, reference.to(dtype))["outputs"]
        assert 0 < part["norm_rel"] < 0.1 and part["nonfinite_mismatch"] == 0, dtype
