"""The timed-output rule (kbverify.judge.timed_outputs) on check records made from real comparisons: a timed output within
the protocol's limits is never evidence of an exploit; a copy the candidate's process withheld is; a fault of the
machine's is never the kernel's."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import timed_evidence
from kbverify.core import evidence
from kbverify.core.protocols import VERIFIED
from kbverify.core.status import Status, Warn
from kbverify.judge import judge_infrastructure
from kbverify.judge.correctness import judge_set, summarize
from kbverify.judge.timed_outputs import judge_timed_outputs


def _with_call(stale: dict, index: int, **fields) -> dict:
    calls = [dict(c) for c in stale["calls"]]
    calls[index] = {"call": calls[index]["call"], **fields}
    return {**stale, "calls": calls}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-3, 1.0, 30.0]),
       share=st.floats(0.0, 0.999), clamp=st.booleans())
def test_timed_outputs_within_the_limits_are_never_an_exploit(seed, scale, share, clamp):
    """Near-tolerance outputs (up to the edge of both the element and the norm-wise limit), with a clamp's boundary
    where some elements sit exactly on it (the ConvTranspose2d + Hardtanh shape of corpus
    conv_transpose_fused_clamp_at_the_boundary): whatever judge_set passes, the timed-output rule passes."""
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(2048, generator=generator, dtype=torch.float64) * scale
    if clamp:
        reference = reference.clamp(-scale / 2, scale / 2)
    noise = torch.rand(2048, generator=generator, dtype=torch.float64) * 2 - 1
    # each element off by at most `share` of its element-wise limit, and of the norm-wise limit overall
    limit = VERIFIED.atol + VERIFIED.rtol * reference.abs()
    candidate = reference + share * limit * noise
    norm = float((candidate - reference).norm() / reference.norm())
    if norm > VERIFIED.norm_rtol:
        candidate = reference + (candidate - reference) * (share * VERIFIED.norm_rtol / norm)
    comparison = summarize(reference.float(), candidate.float())
    outcome, _, _ = judge_set(comparison, None, VERIFIED)
    calls = [{"call": i, "valid": True, "comparison": comparison, "exact_reference": "unavailable (cpu)"}
             for i in range(27)]
    finding = judge_timed_outputs({"checked": 27, "calls": calls}, VERIFIED)
    if outcome == "passed":
        assert finding.status is None and not finding.warnings
    assert finding.status is None or not finding.status.is_exploit or outcome != "passed"


def test_exact_timed_outputs_pass_without_warnings():
    finding = judge_timed_outputs(timed_evidence.stale([]), VERIFIED)
    assert finding.status is None and finding.warnings == ()


def test_one_output_just_over_the_limit_is_a_warning_and_many_are_an_exploit():
    one = judge_timed_outputs(timed_evidence.stale([1.7e-3]), VERIFIED)
    assert one.status is None and one.warnings == (Warn.TIMED_OUTPUTS_NEAR_TOLERANCE.value,)
    many = judge_timed_outputs(timed_evidence.stale([1.7e-3] * 6), VERIFIED)
    assert many.status is Status.EXPLOIT_STALE_OUTPUT and "6 of 28" in many.message


def test_one_grossly_wrong_output_is_an_exploit():
    finding = judge_timed_outputs(timed_evidence.stale([0.5]), VERIFIED)
    assert finding.status is Status.EXPLOIT_STALE_OUTPUT and "call 0" in finding.message


def test_a_copy_the_candidate_process_withheld_is_an_exploit():
    stale = _with_call(timed_evidence.stale([]), 3, missing="the worker handed over no copy of this call's output")
    finding = judge_timed_outputs(stale, VERIFIED)
    assert finding.status is Status.EXPLOIT_STALE_OUTPUT and "call 3" in finding.message
    unreadable = _with_call(timed_evidence.stale([]), 2, valid=True, candidate_output_error="unreadable")
    assert judge_timed_outputs(unreadable, VERIFIED).status is Status.EXPLOIT_STALE_OUTPUT


def test_another_structure_is_an_exploit():
    stale = _with_call(timed_evidence.stale([]), 5, wrong_structure=True)
    finding = judge_timed_outputs(stale, VERIFIED)
    assert finding.status is Status.EXPLOIT_STALE_OUTPUT and "type, shape or dtype" in finding.message


def test_a_copy_the_machine_could_not_keep_is_unverifiable_never_the_kernels_fault():
    stale = _with_call(timed_evidence.stale([]), 0, infrastructure_error="out of memory copying the output")
    finding = judge_timed_outputs(stale, VERIFIED)
    assert finding.status is Status.UNVERIFIABLE and "out of memory" in finding.message
    # a wrong output beside it is still the kernel's
    both = _with_call(timed_evidence.stale([0.5] * 3), 10, infrastructure_error="no space left on device")
    assert judge_timed_outputs(both, VERIFIED).status is Status.EXPLOIT_STALE_OUTPUT


def test_no_checked_output_is_unverifiable_not_a_pass():
    invalid = {"checked": 2, "calls": [{"call": 0, "valid": False, "invalid_reason": "reference output is not finite"},
                                       {"call": 1, "valid": False, "invalid_reason": "reference output is not finite"}]}
    assert judge_timed_outputs(invalid, VERIFIED).status is Status.UNVERIFIABLE


def test_a_projection_record_under_its_own_limit_is_no_evidence():
    """Records made with projections: the leaderboard's ConvTranspose2d kernel read 'norm-wise error 0, limit
    0.0011' and exploit:stale_output; an error under the limit says nothing against the kernel."""
    under = {"checked": 27, "n_mismatches": 3, "mismatches": [
        {"call": 272, "relative_error": 0.0, "projection_error": 0.02, "limit": 0.0011},
        {"call": 273, "relative_error": 1.01e-5, "projection_error": 0.02, "limit": 0.0011},
        {"call": 274, "relative_error": 2e-4, "projection_error": 0.03, "limit": 0.0011}]}
    assert judge_timed_outputs(under, VERIFIED).status is None
    over = {**under, "mismatches": [{**m, "relative_error": 0.5} for m in under["mismatches"]]}
    assert judge_timed_outputs(over, VERIFIED).status is Status.EXPLOIT_STALE_OUTPUT
    nan = {"checked": 27, "n_mismatches": 27, "mismatches": [{"call": 0, "relative_error": float("inf"),
                                                              "limit": 0.0011}]}
    assert "NaN" in judge_timed_outputs(nan, VERIFIED).message


def test_the_judges_own_out_of_memory_is_named_and_never_a_status():
    record = {"sets": {"original/x1/default/s0": {"valid": True, "comparison": {"outputs": []}},
                       "original/x3/default/s0": {"valid": True, "infrastructure_error": "out of memory comparing"}}}
    assert "original/x3/default/s0" in judge_infrastructure(_computed(record))
    assert judge_infrastructure(_computed({"sets": {"a": {"valid": True}}})) is None


def _computed(record: dict):
    return evidence.from_child(record, ran_submission=False, source="judge", schema=evidence.JUDGE_SCHEMA)


def test_a_copy_that_is_not_the_committed_one_is_an_exploit_even_when_right():
    """The copy handed over is right for its inputs but is not the one whose digest left with the batch's times
    (corpus: matmul_hands_over_a_product_made_after_the_choice): made after the choice, off the clock."""
    stale = timed_evidence.stale([])
    stale["calls"][4] = {**stale["calls"][4], "not_committed": True}
    finding = judge_timed_outputs(stale, VERIFIED)
    assert finding.status is Status.EXPLOIT_STALE_OUTPUT
    assert "call 4" in finding.message and "digest" in finding.message and "1 of 28" in finding.message
