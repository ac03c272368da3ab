"""The reference timed in a worker of its own (kbverify.timing.timing_control.run): each side's facts come from the worker
that served it, and a failure of the reference's worker is never the kernel's. Pins the judge's side of corpus
case exploits/matmul_makes_its_product_in_the_harness_copy_step (its end-to-end side is in tests/test_corpus.py).
"""

from __future__ import annotations

import pytest

from kbverify.core import evidence
from kbverify.core.errors import InfrastructureError
from kbverify.core.protocols import VERIFIED
from kbverify.core.status import Status
from kbverify.judge import sides_view, timed_failure
from kbverify.judge.timing import timing_view

CANDIDATE = {"sides": ["cand"], "host_ms": {"cand": {"p50": 0.1}, "ref": {"p50": 9.0}},
             "settle_gaps_ms": {"cand": [0.01], "ref": [5.0]}, "threads_started": {"cand": 0},
             "input_bytes": 1, "output_bytes": 1, "peak_bandwidth_gbps": 1e9, "tampered": []}
REFERENCE = {"sides": ["ref"], "host_ms": {"ref": {"p50": 0.2}}, "settle_gaps_ms": {"ref": [0.02]},
             "threads_started": {"ref": 0}, "input_bytes": 4096, "output_bytes": 4096, "peak_bandwidth_gbps": 3000.0}


def test_each_side_is_read_from_its_own_worker():
    view = sides_view(REFERENCE, CANDIDATE)
    # what the candidate's worker wrote under the reference's name is not read
    assert view["host_ms"] == {"ref": {"p50": 0.2}, "cand": {"p50": 0.1}}
    assert view["settle_gaps_ms"] == {"ref": [0.02], "cand": [0.01]}
    # the work a call must move, and the bandwidth, are the reference worker's measures, not the candidate's word
    assert (view["input_bytes"], view["peak_bandwidth_gbps"]) == (4096, 3000.0)
    assert view["tampered"] == []


def test_a_record_of_one_worker_is_read_as_it_was_written():
    both = {**CANDIDATE, "host_ms": {"cand": {"p50": 0.1}, "ref": {"p50": 0.3}}}
    view = timing_view({"interleaved": both, "rounds": [{"ref_ms": [1.0]}]})
    assert view["host_ms"]["ref"] == {"p50": 0.3}
    assert view["rounds"] == [{"ref_ms": [1.0]}]


def _claimed(record=None):
    return evidence.from_child(record or {}, ran_submission=True, source="the candidate's timing worker",
                               schema=evidence.TIMING_SCHEMA)


def _reference(record=None, ran_submission=False):
    return evidence.from_child(record or {}, ran_submission=ran_submission, source="the reference's timing worker",
                               schema=evidence.TIMING_SCHEMA)


def _failure(**kwargs):
    arguments = {"forged": "", "stopped": "", "failed_side": "", "exit_code": 0, "reference": _reference()}
    return timed_failure(_claimed(kwargs.pop("claimed", None)), VERIFIED, **{**arguments, **kwargs})


def test_a_reference_worker_that_stopped_makes_the_verdict_unverifiable_not_the_kernels():
    status, message = _failure(stopped="the worker stopped answering during the ref batch", failed_side="ref")
    assert status is Status.UNVERIFIABLE and "reference" in message
    status, _ = _failure(forged="the ref batch's reply is not one the harness sends", failed_side="ref")
    assert status is Status.UNVERIFIABLE


def test_a_reference_that_failed_in_its_own_worker_is_unverifiable():
    status, message = _failure(reference=_reference({"error": "RuntimeError: boom", "error_side": "reference"}))
    assert status is Status.UNVERIFIABLE and "boom" in message


def test_the_candidates_forgery_is_tamper_whatever_the_reference_did():
    status, _ = _failure(forged="the cand batch claimed 9 ms of calls in 1 ms", failed_side="cand",
                         reference=_reference({"error": "RuntimeError: boom"}))
    assert status is Status.EXPLOIT_TAMPER


def test_a_failure_beside_the_candidate_of_a_reference_that_ran_alone_is_the_candidates():
    status, _ = _failure(claimed={"error": "RuntimeError: boom", "error_side": "reference"})
    assert status is Status.RUNTIME_ERROR


def test_a_candidate_that_stopped_is_its_own_failure():
    status, _ = _failure(stopped="the worker stopped answering during the cand batch", failed_side="cand")
    assert status is Status.CRASHED


def test_an_honest_pair_of_workers_ends_nothing():
    assert _failure() is None


def test_a_reference_record_of_the_wrong_origin_or_shape_is_kbverifys_fault():
    with pytest.raises(InfrastructureError):
        _failure(reference=_reference(ran_submission=True))
    with pytest.raises(InfrastructureError):
        _failure(reference=_reference({"tampered": "not a list"}))
