"""Timing decisions made from raw GPU records (no GPU needed): a reference that ran slower beside the candidate
than in a clean process gives the speedup against the clean time, never an inflated one, and is no exploit by
itself; the unsynchronised-work rule compares the candidate's idle gap with the reference's."""

from __future__ import annotations

import dataclasses
import random

import pytest

import timed_evidence

from kbverify.core import stats
from kbverify.core.protocols import VERIFIED
from kbverify.core.records import Verdict
from kbverify.core.status import Status, Warn
from kbverify.harness.runner import decide_timing


def _rounds(ref_ms: float, cand_ms: float, n: int = 30, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"ref_ms": [ref_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)],
             "cand_ms": [cand_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]} for _ in range(n)]


def _verdict(ref_beside_ms: float, clean_ms: float | None, cand_ms: float, gaps: dict | None = None,
             stale: dict | None = None) -> Verdict:
    interleaved = {"rounds": _rounds(ref_beside_ms, cand_ms),
                   "settle_gaps_ms": gaps or {"ref": [0.01] * 30, "cand": [0.01] * 30}}
    clean = {"rounds": _rounds(clean_ms, clean_ms, seed=1)} if clean_ms else None
    return Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="0",
                   protocol="verified", protocol_sha256="0", status=Status.PASSED,
                   timing={"interleaved": interleaved, "timed_outputs": stale or timed_evidence.stale([], 29),
                           "clean_reference": clean, "noise_margin": 0.02,
                           "device": "cuda:0"})


def test_slowed_reference_gives_the_speedup_against_the_clean_time():
    decided = decide_timing(_verdict(ref_beside_ms=0.27, clean_ms=0.16, cand_ms=0.10), VERIFIED)
    assert decided.status is Status.PASSED
    assert Warn.REFERENCE_SLOWED.value in decided.warnings
    assert decided.speedup == pytest.approx(1.6, rel=0.02)  # not 2.7
    assert decided.speedup_ci[0] <= decided.speedup <= decided.speedup_ci[1] < 1.7
    # wider than the paired interval alone, by the clean time's own A/A uncertainty
    record = _verdict(ref_beside_ms=0.27, clean_ms=0.16, cand_ms=0.10).timing["interleaved"]
    paired = stats.paired_speedup([(r["ref_ms"], r["cand_ms"]) for r in record["rounds"]])
    assert (decided.speedup_ci[1] / decided.speedup_ci[0]) > (paired.ci_high / paired.ci_low)
    assert decided.ref_time_ms == pytest.approx(0.16, rel=0.02)


def test_reference_within_noise_of_the_clean_one_keeps_the_paired_estimate():
    decided = decide_timing(_verdict(ref_beside_ms=0.165, clean_ms=0.16, cand_ms=0.10), VERIFIED)
    assert Warn.REFERENCE_SLOWED.value not in decided.warnings
    assert decided.speedup == pytest.approx(1.65, rel=0.02)


def test_unsynchronized_work_needs_a_gap_beyond_the_references():
    same = decide_timing(_verdict(0.16, 0.16, 0.10, gaps={"ref": [0.09] * 30, "cand": [0.095] * 30}), VERIFIED)
    assert same.status is Status.PASSED
    late = decide_timing(_verdict(0.16, 0.16, 0.10, gaps={"ref": [0.01] * 30, "cand": [0.5] * 30}), VERIFIED)
    assert late.status is Status.EXPLOIT_UNSYNCHRONIZED


def _stale(errors: list[float], checked: int = 28) -> dict:
    return timed_evidence.stale(errors, checked)


def test_one_timed_output_just_over_the_limit_is_a_warning_not_an_exploit():
    decided = decide_timing(_verdict(0.16, 0.16, 0.10, stale=_stale([1.7e-3])), VERIFIED)
    assert decided.status is Status.PASSED
    assert Warn.TIMED_OUTPUTS_NEAR_TOLERANCE.value in decided.warnings


def test_many_timed_outputs_just_over_the_limit_are_a_different_timed_path():
    decided = decide_timing(_verdict(0.16, 0.16, 0.10, stale=_stale([2.5e-3] * 10)), VERIFIED)
    assert decided.status is Status.EXPLOIT_STALE_OUTPUT
    # a timed path in bf16 on one call in seven: little to gain, and still caught
    some = decide_timing(_verdict(0.16, 0.16, 0.10, stale=_stale([2.5e-3] * 4)), VERIFIED)
    assert some.status is Status.EXPLOIT_STALE_OUTPUT


def test_one_grossly_wrong_timed_output_is_stale():
    decided = decide_timing(_verdict(0.16, 0.16, 0.10, stale=_stale([0.9])), VERIFIED)
    assert decided.status is Status.EXPLOIT_STALE_OUTPUT


def test_a_kept_output_reading_nan_is_stale_and_says_why():
    decided = decide_timing(_verdict(0.16, 0.16, 0.10, stale=_stale([float("inf")] * 28)), VERIFIED)
    assert decided.status is Status.EXPLOIT_STALE_OUTPUT
    assert "NaN" in decided.message


def test_many_calls_with_host_work_beyond_the_hold_are_flagged_on_the_gpu():
    verdict = _verdict(0.16, 0.16, 0.10)
    interleaved = {**verdict.timing["interleaved"], "uncovered_calls": {"ref": 0, "cand": 40}}
    flagged = decide_timing(dataclasses.replace(verdict, timing={**verdict.timing, "interleaved": interleaved}),
                            VERIFIED)
    assert Warn.HOST_TIME_TIMED.value in flagged.warnings
    few = {**interleaved, "uncovered_calls": {"ref": 2, "cand": 3}}
    quiet = decide_timing(dataclasses.replace(verdict, timing={**verdict.timing, "interleaved": few}), VERIFIED)
    assert Warn.HOST_TIME_TIMED.value not in quiet.warnings


def test_extra_host_work_beyond_the_references_device_time_is_flagged():
    verdict = _verdict(0.16, 0.16, 0.10)
    def with_host(ref_p50, cand_p50):
        interleaved = {**verdict.timing["interleaved"],
                       "host_ms": {"ref": {"p50": ref_p50}, "cand": {"p50": cand_p50}}}
        return decide_timing(dataclasses.replace(verdict, timing={**verdict.timing, "interleaved": interleaved}),
                             VERIFIED)
    assert Warn.HOST_OVERHEAD.value in with_host(0.05, 0.5).warnings  # 0.45 ms more host work, 0.16 ms reference
    assert Warn.HOST_OVERHEAD.value not in with_host(0.05, 0.1).warnings
    assert Warn.HOST_OVERHEAD.value not in with_host(0.19, 0.26).warnings  # within the host's jitter


def test_an_offset_between_reference_instances_widens_the_interval_by_what_a_rerun_redraws():
    """The reference beside the candidate 3% off the clean process's copy: an instance offset a rerun redraws
    for both sides, so the interval must reach well beyond the paired one (which stays ±1% here)."""
    steady = decide_timing(_verdict(ref_beside_ms=0.16, clean_ms=0.16, cand_ms=0.10), VERIFIED)
    offset = decide_timing(_verdict(ref_beside_ms=0.165, clean_ms=0.16, cand_ms=0.10), VERIFIED)
    low, high = offset.speedup_ci
    assert low <= offset.speedup <= high
    assert high / low > 1.15  # t(2)·√2·(3%/√2·…): several times the ±1% of the paired interval
    assert (high / low) > 3 * (steady.speedup_ci[1] / steady.speedup_ci[0] - 1) + 1
    # an estimate alone cannot claim `faster` beyond what the instance offset allows
    assert offset.speed_class == "faster"  # 1.65x stays clear even so
    narrow = decide_timing(_verdict(ref_beside_ms=0.103, clean_ms=0.10, cand_ms=0.10), VERIFIED)
    assert narrow.speed_class == "ambiguous"  # 1.03x with a 3% instance offset is not a claim


def test_without_a_clean_reference_the_paired_interval_stands():
    decided = decide_timing(_verdict(ref_beside_ms=0.165, clean_ms=None, cand_ms=0.10), VERIFIED)
    assert decided.speedup_ci[1] / decided.speedup_ci[0] < 1.03
