"""`rescore --share-gpu` admits a unit's correctness phase by memory, with the audit's ledger: its need from the
reference's peak recorded in the store (else the task's meta-device footprint), reserved before a shared slot; a unit
whose need is unknown, alone over the budget, or that found no room in time, has the device to itself. No worker
process: the ledger is a file, the lease a recorder of what was asked of it."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from kbverify.audit.admission import MemoryLedger
from kbverify.audit.footprint import PEAK_MARGIN, Footprint
from kbverify.core.records import Verdict
from kbverify.harness.device_share import CORRECTNESS, TIMING, DeviceLease, Sharing, phase
from kbverify.rescore.rescore_memory import (FOOTPRINT_FACTOR, PAIR_FACTOR, Admission, recorded_reference_peaks,
                                     unit_need_bytes)
from kbverify.core.status import Status
from kbverify.results.store import Store

import gpu_stores

GIB = 2**30


class _Lease:
    """What a lease was asked for, in order; grants at once."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def shared(self, holder=""):
        self.asked.append(("shared", holder))
        yield

    @contextlib.contextmanager
    def exclusive(self, holder=""):
        self.asked.append(("exclusive", holder))
        yield


def _verdict(task: str, timing: dict, gpu: str | None = "NVIDIA H100 80GB HBM3") -> Verdict:
    return Verdict(task=task, task_name=task, level=1, problem_id=1, submission="s", submission_sha256="",
                   protocol="verified", protocol_sha256="", status=Status.PASSED, timing=timing,
                   provenance={"gpu_model": gpu} if gpu else {})


def test_the_reference_peaks_recorded_on_a_gpu_are_read_from_a_real_store(tmp_path):
    """The H200 store of 2026-12-03 call 3: 40 verdicts, 16 timed with the reference's peak in the timing record."""
    database = gpu_stores.copy_store("h200-2026-12-03/call3/anchor_store_f_share4.sqlite", tmp_path / "store.sqlite")
    verdicts = [verdict for _, verdict in Store(database, existing=True).verdicts()]
    peaks = recorded_reference_peaks(verdicts, "NVIDIA H200")
    assert len(verdicts) == 40 and len(peaks) == 16
    assert peaks["level2/83_level2@e168a874424a"] == 232243200
    assert recorded_reference_peaks(verdicts, "NVIDIA H100 80GB HBM3") == {}  # another GPU's peaks do not count


def test_the_latest_peak_of_a_task_wins_and_untimed_verdicts_give_none():
    verdicts = [_verdict("a", {"ref_peak_memory_bytes": 10}), _verdict("b", {}),
                _verdict("a", {"interleaved": {"ref_peak_memory_bytes": 30}}), _verdict("c", {"ref_peak_memory_bytes": 0}),
                _verdict("d", {"ref_peak_memory_bytes": 7}, gpu=None)]
    assert recorded_reference_peaks(verdicts, "NVIDIA H100 80GB HBM3") == {"a": 30, "d": 7}


def test_a_units_need_is_its_references_peak_for_the_pair_else_its_footprint():
    footprint = Footprint("full", input_bytes=GIB, parameter_bytes=0, output_bytes=GIB)
    assert unit_need_bytes(GIB, footprint) == int(int(GIB * PAIR_FACTOR) * PEAK_MARGIN)  # the recorded peak wins
    assert unit_need_bytes(None, footprint) == int(2 * GIB * FOOTPRINT_FACTOR)
    assert unit_need_bytes(None, Footprint("unknown")) is None
    assert unit_need_bytes(None, None) is None


def test_units_share_the_device_while_their_needs_fit_the_budget(tmp_path):
    ledger = MemoryLedger(tmp_path, budget_bytes=10 * GIB)
    lease = _Lease()
    first, second = Admission(ledger, "u1", 4 * GIB), Admission(ledger, "u2", 4 * GIB)
    third = Admission(ledger, "u3", 4 * GIB, defer_s=0.0)  # no room and no wait: alone
    with first.shared(lease, "u1"), second.shared(lease, "u2"):
        assert sorted(r.key for r in ledger.in_flight()) == ["u1", "u2"]
        with third.shared(lease, "u3"):
            assert sorted(r.key for r in ledger.in_flight()) == ["u1", "u2"]  # the lone unit reserves nothing
    assert lease.asked == [("shared", "u1"), ("shared", "u2"), ("exclusive", "u3")]
    assert ledger.in_flight() == []  # every reservation given back when its phase ended
    with third.shared(lease, "u3"):  # room again: shared
        assert [r.key for r in ledger.in_flight()] == ["u3"]
    assert lease.asked[-1] == ("shared", "u3")


def test_an_unknown_or_oversized_need_has_the_device_to_itself(tmp_path):
    ledger = MemoryLedger(tmp_path, budget_bytes=10 * GIB)
    lease = _Lease()
    for key, need in (("unknown", None), ("huge", 12 * GIB)):
        with Admission(ledger, key, need).shared(lease, key):
            assert ledger.in_flight() == []
    assert lease.asked == [("exclusive", "unknown"), ("exclusive", "huge")]


def test_a_phase_reserves_through_the_admission_and_a_unit_again_alone_does_not(tmp_path):
    ledger = MemoryLedger(tmp_path, budget_bytes=10 * GIB)
    lease = DeviceLease("cuda:0", slots=4)
    sharing = Sharing(lease, admission=Admission(ledger, "u1", 3 * GIB))
    with phase(sharing, CORRECTNESS, "u1"):
        assert lease.holders() == (1, False) and [r.key for r in ledger.in_flight()] == ["u1"]
    with phase(dataclasses.replace(sharing, alone=True), CORRECTNESS, "u1"):
        assert lease.holders() == (0, True) and ledger.in_flight() == []
    with phase(sharing, TIMING, "u1"):  # timing is alone by the lease: nothing to reserve
        assert lease.holders() == (0, True) and ledger.in_flight() == []


def test_the_admission_is_refused_a_budget_of_nothing(tmp_path):
    with pytest.raises(ValueError):
        MemoryLedger(tmp_path, budget_bytes=0)
