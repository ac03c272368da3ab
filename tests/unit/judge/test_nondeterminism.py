"""The nondeterminism guard under the protocol's limits: two runs that differ by less than the rule the reference
is judged with are an order of summation (cuDNN's ConvTranspose2d on the wide set), not an output that depends on
what memory held; a difference beyond the limits, or NaN where the first run had a value, is an exploit."""

from __future__ import annotations

import timed_evidence
from kbverify.core.protocols import VERIFIED
from kbverify.core.status import Status
from kbverify.judge import decide_set

OUTPUTS = {"lazy": False, "no_storage": False, "aliases": [], "views": []}


def _decide(second_vs_first: dict | None) -> Status:
    cand = {"outputs": OUTPUTS, "mutated_inputs": [], "deterministic": False,
            "determinism_detail": "output 0: 3 elements differ between two runs (0 NaN positions)"}
    if second_vs_first is not None:
        cand["second_vs_first"] = second_vs_first
    ref = {"valid": True, "comparison": timed_evidence.comparison(0.0)}
    return decide_set(cand, ref, VERIFIED, {})[0]


def test_runs_that_differ_within_the_limits_pass():
    assert _decide(timed_evidence.comparison(2e-5)) is Status.PASSED


def test_runs_that_differ_beyond_the_limits_are_nondeterministic():
    assert _decide(timed_evidence.comparison(0.3)) is Status.EXPLOIT_NONDETERMINISTIC
    assert _decide(timed_evidence.comparison(float("inf"))) is Status.EXPLOIT_NONDETERMINISTIC


def test_records_without_the_measurement_keep_their_verdict():
    assert _decide(None) is Status.EXPLOIT_NONDETERMINISTIC
