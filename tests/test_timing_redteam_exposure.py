"""Red team of the blocked copy's exposure (a39b38c, f5c0142, bbeb0c4): where only the candidate blocked, the
threshold of the confirmation was raised by what the reference's harness-authored blocked copy left unexplained,
and the settle-gap guard was given the copy's excess. Both allowances went to whoever said it blocked (evidence
its own process makes): they were removed, each clock is judged on its own kind's batches everywhere, and the
harness's own work after a call no longer differs between a blocked side and one that is not
(kbverify.worker.timed_call). The cases below stand as tests of that.

What the candidate's worker reports (its per-call times, the hold probe, the settle gaps) is the attacker's; the
parent's walls and the blocked copy's record are not. Synthetic records, the helpers of tests/test_timing_modes.py.

Passing tests hold a rule that stands; `xfail(strict=True)` tests are open holes, with their numbers.
"""

from __future__ import annotations

import random

import pytest
from test_timing_modes import KERNEL_EXPOSURE_MS, _clean, _probe, _unexplained_rounds, _verdict, _with_exposure

from kbverify.core.protocols import VERIFIED
from kbverify.core.status import Status
from kbverify.harness.runner import decide_timing
from kbverify.timing.clocks import clock_view

REF_MS = 0.15


def _speedups(verdict) -> dict:
    return {clock: clock_view(verdict, clock).speedup for clock in ("device", "host")}


def _not_blocking(true_ms: float, claim_ms: float, *, claims_to_block: bool, seed: int = 5):
    """A candidate whose forward does NOT wait on the device (its batches leave no exposure of their own: the
    parent's walls are its true time plus the reference's harness share), reporting `claim_ms` a call of both
    kinds; `claims_to_block`: its worker's hold probe follows the hold (forged, or blocking in the warm-up calls
    only, which is where the probe runs)."""
    rounds = _unexplained_rounds(REF_MS, true_ms, claim_ms, seed=seed)
    probe = {"ref": _probe(False), "cand": _probe(claims_to_block)}
    return decide_timing(_verdict(rounds, probe=probe, clean=_clean((REF_MS, REF_MS))), VERIFIED)


# ---- 1. the allowance goes to whoever says it blocks ---------------------------------------------------------

def test_a_forward_that_does_not_block_gains_nothing_by_saying_it_does():
    honest = _not_blocking(0.10, 0.10, claims_to_block=False)
    faked = _not_blocking(0.10, 0.04, claims_to_block=True)
    assert faked.timing["mode"] == "sync"
    for clock, speedup in _speedups(faked).items():
        assert speedup <= _speedups(honest)[clock] * 1.1, (clock, speedup)


def test_the_same_shrink_without_the_claim_is_the_parents_clock():
    """With the claim or without it, the same shrink is read from the parent's clock."""
    for claims in (False, True):
        verdict = _not_blocking(0.10, 0.04, claims_to_block=claims)
        for clock, speedup in _speedups(verdict).items():
            assert speedup == pytest.approx(REF_MS / 0.10, rel=0.05), (claims, clock)


@pytest.mark.parametrize("true_ms", [0.05, 0.1, 0.3, 1.0])
def test_what_saying_it_blocks_can_gain_is_bounded_by_the_threshold(true_ms):
    """A claimed time is believed only down to about the true time less the usual threshold (10% of the claim, at
    least 5 us), whatever the candidate says about blocking (the copy's exposure, 0.06 ms a call on an H100, was
    granted on top of it before)."""
    for shrink_ms in (0.03, 0.06, 0.09, 0.2):
        claim = max(true_ms - shrink_ms, 0.002)
        verdict = _not_blocking(true_ms, claim, claims_to_block=True)
        for clock in ("device", "host"):
            cand_ms = clock_view(verdict, clock).cand_time_ms
            floor = true_ms - max(0.005, 0.1 * claim) - 0.003
            assert cand_ms >= min(claim, floor) * 0.98, (clock, shrink_ms, cand_ms)


def test_saying_it_blocks_buys_no_room_to_leave_work_past_the_end_event():
    def verdict(claims: bool):
        rounds = _unexplained_rounds(REF_MS, 0.05 + 0.04, 0.05, seed=5)
        v = _verdict(rounds, probe={"ref": _probe(False), "cand": _probe(claims)}, clean=_clean((REF_MS, REF_MS)))
        v.timing["interleaved"]["settle_gaps_ms"] = {"ref": [0.027] * 30, "cand": [0.067] * 30}
        return decide_timing(v, VERIFIED)

    assert verdict(False).status is Status.EXPLOIT_UNSYNCHRONIZED
    faked = verdict(True)
    assert faked.status is Status.EXPLOIT_UNSYNCHRONIZED, (faked.status, faked.speedup)


# ---- 2. the pooled confirmation: one kind's batches vouch for the other's times ------------------------------

def _cross_kind(host_claim_ms: float, device_claim_ms: float, true_ms: float = 0.10, seed: int = 5) -> list:
    """A non-blocking candidate of `true_ms` that shrinks its host-kind times and inflates its device-kind times
    (still within the device batch's wall, which holds the hold: no TimingForged)."""
    rounds = _unexplained_rounds(REF_MS, true_ms, true_ms, seed=seed)
    rng = random.Random(seed)
    for r in rounds:
        r["cand_host_ms"] = [host_claim_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(3)]
        r["cand_ms"] = [device_claim_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(3)]
        assert sum(r["cand_ms"]) <= r["cand_wall_ms"]
    return rounds


def test_where_the_candidate_alone_blocks_one_kind_cannot_vouch_for_the_other():
    """Inflated device-kind times are clock evidence of blocking: the candidate alone blocks, each kind is judged
    on its own batches (bbeb0c4), and the shrunk host-kind times read as the parent's clock."""
    verdict = decide_timing(_verdict(_cross_kind(0.01, 0.5), clean=_clean((REF_MS, REF_MS))), VERIFIED)
    assert verdict.timing["mode"] == "sync" and verdict.timing["clock_used"] == "net_wall"
    for clock, speedup in _speedups(verdict).items():
        assert speedup == pytest.approx(REF_MS / 0.10, rel=0.05), clock


@pytest.mark.parametrize("route", ["reference_probe_forged", "hold_requested"])
def test_one_kinds_batches_cannot_vouch_for_the_others_times(route):
    rounds = _cross_kind(0.01, 0.5)
    if route == "reference_probe_forged":
        verdict = _verdict(rounds, probe={"ref": _probe(True), "cand": _probe(False)}, clean=_clean((REF_MS, REF_MS)))
    else:
        verdict = _verdict(rounds, clean=_clean((REF_MS, REF_MS)), requested="hold")
    verdict = decide_timing(verdict, VERIFIED)
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= REF_MS / 0.10 * 1.1, (route, clock, speedup)


# ---- 3. the device clock of a candidate that really blocks ---------------------------------------------------

@pytest.mark.parametrize("device_claim_ms", [0.08, 0.04, 0.01])
def test_a_blocked_candidates_device_clock_is_not_its_claim(device_claim_ms):
    """A forward that really blocks leaves 0.117 ms a call unexplained in the device kind (it waits out the hold),
    twice the copy's 0.057: its device kind stays unconfirmed, so shrinking its device-kind times moves nothing;
    the device clock is the net wall, capped at the (confirmed) host clock."""
    rounds = _with_exposure(_unexplained_rounds(REF_MS, 0.08, 0.08), KERNEL_EXPOSURE_MS)
    for r in rounds:
        r["cand_ms"] = [device_claim_ms] * 3
    verdict = _verdict(rounds, probe={"ref": _probe(False), "cand": _probe(True)}, clean=_clean((REF_MS, REF_MS)))
    verdict = decide_timing(verdict, VERIFIED)
    assert verdict.timing["clocks"]["device"]["source"] == "net_wall"
    assert clock_view(verdict, "device").speedup <= REF_MS / 0.08 * 1.03
