"""Comparing two runs: the change, the combined-CI test and faster↔slower crossings, on hand-made verdicts."""

from __future__ import annotations

import math

import pytest

from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.results.repeatability import compare_runs


def _verdict(submission: str, speedup: float | None, half_width: float = 0.01, speed_class: str = "faster",
             status: Status = Status.PASSED, protocol: str = "verified") -> Verdict:
    ci = (speedup * math.exp(-half_width), speedup * math.exp(half_width)) if speedup else None
    return Verdict(task=f"level1/{submission}@0", task_name=submission, level=1, problem_id=1, submission=submission,
                   submission_sha256="0", protocol=protocol, protocol_sha256="0", status=status, speedup=speedup,
                   speedup_ci=ci, speed_class=speed_class if speedup else None)


def test_identical_runs_do_not_move():
    run = [_verdict("a", 2.0), _verdict("b", 0.5, speed_class="slower")]
    result = compare_runs(run, run, "verified")
    assert result.median_abs_change == 0.0 and result.share_within_combined_ci == 1.0 and not result.crossings


def test_moves_are_judged_against_both_intervals():
    a = [_verdict("small", 2.0), _verdict("large", 2.0), _verdict("flip", 1.05, 0.02)]
    b = [_verdict("small", 2.02), _verdict("large", 2.2),
         _verdict("flip", 0.95, 0.02, speed_class="slower")]
    result = compare_runs(a, b, "verified")
    by = {k.submission: k for k in result.kernels}
    # 1% apart with ±1% intervals each: within sqrt(2)·1%; 10% apart is not
    assert by["small"].within_combined_ci is True and by["large"].within_combined_ci is False
    assert by["large"].change == pytest.approx(0.1)
    assert [k.submission for k in result.crossings] == ["flip"]
    assert result.share_within_combined_ci == pytest.approx(1 / 3)


def test_only_kernels_correct_in_both_runs_are_compared():
    a = [_verdict("x", 2.0), _verdict("y", 3.0), _verdict("z", 1.5), _verdict("x", 9.0, protocol="original")]
    b = [_verdict("x", 2.0), _verdict("y", None, status=Status.INCORRECT)]
    result = compare_runs(a, b, "verified")
    assert [k.submission for k in result.kernels] == ["x"]
    assert result.status_changed == (("y", "passed", "incorrect"),)
    assert result.only_in_a == ("z",) and result.only_in_b == ()
