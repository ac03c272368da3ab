"""Red team of the per-kind confirmation (6acd058): each clock (device, host) is confirmed on its own kind's
batches (confirmation.device_time_confirmed with kinds=(kind,)) and takes the net wall of its own kind where
that kind is unconfirmed; the device clock is capped at the host clock's side medians (timing_modes._capped).

What the candidate's worker reports (both sides' per-call times, the hold probe, the settle gaps, n_unsettled) is
the attacker's; the parent's walls, the round count and order, and the clean process's record are not. Synthetic
records, the helpers of tests/test_timing_modes.py: a reference of 0.15 ms a call and a candidate whose calls
truly take 0.10 ms (1.50x) unless said otherwise.

Findings (xfail strict: an open hole, with its numbers; plain tests: a rule that holds):

1. The confirmation is a one-sided test of d's *median*, with the 80% rule needing its order-statistic lower
   bound above zero: a candidate that shrinks its times tenfold in just over half the rounds, and claims a
   little more than its true time in the rest (d < 0 there), is confirmed on both kinds; the speedup, the median
   of the per-round ratios, then lies among the shrunk rounds. 1.50x is credited 9.9x on both clocks and the
   headline, class `faster`, no warning, at any round count (10 to 1000).
2. Fewer than two rounds confirm by default, and the round count is the submission's to set: a first round
   longer than half the budget (a sleep in one call: 1 s of the default 2 s, far inside the 45 s hang floor)
   ends the rounds after it (timing_control.no_time_for_another_round), and its claims are taken as they are:
   1.50x credited 15x (tight interval, `faster`). Two rounds, one padded and one shrunk, are confirmed too.
3. The device clock's net wall is capped at the host clock's medians: where the device kind is caught (net
   wall) but the host kind is confirmed by (1), the device clock reads the host kind's shrunk claims (10x),
   so the per-kind rule does not keep one kind's confirmation from setting the other clock.
4. Both sides' times shrunk by the same amount leave d at zero: the reference beside the candidate reads faster
   than the clean process's, which only widened the interval (`_against_clean_reference` adjusts a slowed
   reference, never a fast one). 1.50x was credited 6.0x on both clocks (class `ambiguous`; the point estimate
   is what fast_p counts). Closed: a reference faster beside the candidate than alone beyond the tolerance voids
   both sides' times (kbverify.judge.timing._hastened_kinds); the clocks read the parent's walls.

What would close (1)-(3), tried on the H200 stores e, f (share 4) and the share-1 three (tests/data/gpu_stores.tar.xz), not
committed: (a) flooring each round's claim at that round's net wall less the threshold closes all three (their
cases pass, and every other test of the timing files does) but moves honest microsecond kernels, whose per-round
harness jitter (about +-0.1 ms a call on the H200) exceeds the 5 us threshold: 8 verdicts moved 2-12% down
(level2/35 of f 1.00x -> 0.88x, level1/39 of e 1.00x -> 0.93x; fast_1 of store e 7 -> 4); (b) unconfirming a kind
whose worker speedup exceeds its unfloored net wall's by the threshold moves two verdicts, one honest (level2/35
of f, 1.00x -> 0.81x: a 48 us kernel's net-wall median is that noisy); the other is level2/80 of store e, read
19.7x on a 1.3 us claim whose net wall reads 2.2x (store f's run of it was unconfirmed, 2.1x): worth a look. The
mixture's own record is not noisy: d's median is the shrink (17x the threshold); only its confidence bound is
held down, so a test of the rounds the estimate comes from, not of all rounds, is the direction.
"""

from __future__ import annotations

import math
import random

import pytest
from test_timing_modes import _clean, _probe, _unexplained_rounds, _verdict

from kbverify.core.protocols import VERIFIED
from kbverify.core.rules import DEFAULT_RULES
from kbverify.harness.runner import decide_timing
from kbverify.timing.clocks import clock_view
from kbverify.timing.timing_control import side_key

REF_MS = 0.15
TRUE_MS = 0.10
HONEST = REF_MS / TRUE_MS
GAIN_ALLOWED = 1 + DEFAULT_RULES.unexplained_fraction + 0.02  # the threshold's 10%, and the jitter's share


def _speedups(verdict) -> dict:
    return {"headline": verdict.speedup, **{clock: clock_view(verdict, clock).speedup for clock in ("device", "host")}}


def _judge(rounds, **kwargs):
    return decide_timing(_verdict(rounds, clean=_clean((REF_MS, REF_MS)), **kwargs), VERIFIED)


def _honest_count(n: int) -> int:
    """The fewest rounds with d <= 0 that keep the 80% rule's lower bound at or below zero
    (confirmation._median_lower_bound at z = 1.2816): it takes the (k+1)-th smallest d."""
    return max(0, int(n / 2 - 1.2816 * math.sqrt(n) / 2) - 1) + 1


def _mixture(n: int, claim_ms: float, *, honest: int | None = None, pad_ms: float = 0.01,
             kinds=("device", "host"), seed: int = 5) -> list:
    """Rounds of a candidate whose calls take TRUE_MS by the parent's clock; in `honest` rounds (chosen at random)
    it claims TRUE_MS + pad_ms a call, in the others `claim_ms`, in the batches of `kinds` (the other kind's claims
    are its true time)."""
    honest = _honest_count(n) if honest is None else honest
    shrunk = _unexplained_rounds(REF_MS, TRUE_MS, claim_ms, n=n, seed=seed)
    padded = _unexplained_rounds(REF_MS, TRUE_MS, TRUE_MS + pad_ms, n=n, seed=seed)
    true = _unexplained_rounds(REF_MS, TRUE_MS, TRUE_MS, n=n, seed=seed)
    chosen = set(random.Random(seed + 1).sample(range(n), honest))
    for index, r in enumerate(shrunk):
        for kind in ("device", "host"):
            key = side_key("cand", kind)
            source = true if kind not in kinds else padded if index in chosen else None
            if source is not None:
                r[key] = source[index][key]
            assert sum(r[key]) <= r[side_key("cand", kind, "wall_ms")]  # within the parent's clock: no forgery
    return shrunk


# ---- 1. a mixture of shrunk and padded rounds is confirmed --------------------------------------------------

@pytest.mark.parametrize("n", [40, 200, 1000])
def test_shrinking_just_over_half_the_rounds_gains_nothing(n):
    verdict = _judge(_mixture(n, 0.015))
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup, verdict.timing["unexplained_ms"]["by_kind"])


def test_the_mixture_is_judged_on_the_rounds_its_speedup_rests_on():
    """The mechanism of (1), on the record: judged over every round, d's median was the shrink (0.085 ms, past the
    5 us threshold) with its 80% bound at or below zero. The speedup is a median of per-round ratios: judged on
    the rounds at or above the median ratio (nearly all shrunk), the bound is past the threshold."""
    verdict = _judge(_mixture(200, 0.015))
    for kind in ("device", "host"):
        seen = verdict.timing["unexplained_ms"]["by_kind"][kind]
        assert seen["judged_rounds"] <= seen["rounds"] // 2 + 1
        assert seen["lower_bound_ms"] > seen["threshold_ms"], seen
    assert verdict.timing["device_time_confirmed"] is False


def test_a_minority_of_shrunk_rounds_moves_the_median_by_no_more_than_its_noise():
    """What holds: with the shrunk rounds a minority (a third) the median of the per-round ratios stays among
    the honest rounds; the gain is the honest rounds' own spread."""
    verdict = _judge(_mixture(200, 0.015, honest=134, pad_ms=0.0))
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup)


# ---- 2. too few rounds to judge, and the round count is the submission's --------------------------------------

def _one_long_round(claim_ms: float) -> list:
    """One round whose candidate batch the parent saw take 1.2 s longer (a sleep in one of its calls: the budget
    of 2 s is then judged spent after the round, since a second would end past it), claiming `claim_ms` a call."""
    rounds = _unexplained_rounds(REF_MS, TRUE_MS, claim_ms, n=1)
    rounds[0]["cand_wall_ms"] += 1200.0
    return rounds


def test_the_budget_rule_ends_the_rounds_after_one_long_first_round():
    """The mechanism of (2): the parent starts no round that would, at the pace so far, end past the budget."""
    from kbverify.timing.timing_control import no_time_for_another_round

    assert no_time_for_another_round(1.2, 1, 2.0)


def test_one_round_confirms_nothing():
    verdict = _judge(_one_long_round(0.01))
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup)


def test_two_rounds_one_of_them_shrunk_gain_nothing():
    rounds = _mixture(2, 0.01, honest=1)
    verdict = _judge(rounds)
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup)


def test_an_honest_slow_kernel_with_one_round_reads_its_own_times():
    """The honest side of (2): a single round of true claims reads its true speedup (the stricter reading the
    fix would take, the net wall, is within the threshold of it too)."""
    verdict = _judge(_unexplained_rounds(REF_MS, TRUE_MS, TRUE_MS, n=1))
    for clock, speedup in _speedups(verdict).items():
        assert speedup == pytest.approx(HONEST, rel=0.03), clock


# ---- 3. the device clock capped at a host clock that was confirmed ----------------------------------------------

def _device_caught_host_mixed(n: int = 10) -> list:
    """The device kind's claims shrunk tenfold in every round (caught: net wall); the host kind's by the
    mixture of (1)."""
    rounds = _mixture(n, 0.015, kinds=("host",))
    for r in rounds:
        r["cand_ms"] = [0.015] * 3
    return rounds


def test_a_device_kind_shrunk_in_every_round_is_the_net_wall():
    verdict = _judge(_device_caught_host_mixed())
    assert verdict.timing["clocks"]["device"]["source"] == "net_wall"
    assert verdict.timing["clocks"]["host"]["source"] == "net_wall"  # and the host kind's mixture with it


def test_a_caught_device_kind_is_not_set_by_the_host_kinds_claims():
    verdict = _judge(_device_caught_host_mixed())
    assert clock_view(verdict, "device").speedup <= HONEST * GAIN_ALLOWED


# ---- 4. both sides shrunk alike ------------------------------------------------------------------------------

def _both_shrunk(x_ms: float, n: int = 200) -> list:
    rounds = _unexplained_rounds(REF_MS, TRUE_MS, TRUE_MS - x_ms, n=n)
    for r in rounds:
        for kind in ("device", "host"):
            key = side_key("ref", kind)
            r[key] = [t - x_ms for t in r[key]]
    return rounds


def test_a_reference_faster_beside_the_candidate_than_alone_buys_nothing():
    """(4), closed: both sides shrunk by 0.09 ms a call (d at zero, a true 1.5x read 6.0x) leave the reference
    beside the candidate 2.5x faster than the clean process's; both sides' times are then voided, and each clock
    reads the parent's walls, flagged."""
    verdict = _judge(_both_shrunk(0.09))
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup)
    assert "reference_faster_beside_candidate" in verdict.warnings
    assert verdict.timing["clock_used"] == "wall"
    assert set(verdict.timing["reference_hastened"]) == {"device", "host"}


def test_an_honest_reference_as_fast_beside_as_alone_keeps_the_workers_times():
    """The honest side of (4): no shrink, the reference beside the candidate as fast as alone."""
    verdict = _judge(_both_shrunk(0.0))
    assert "reference_faster_beside_candidate" not in verdict.warnings
    assert verdict.timing["clock_used"] in ("device", "host")
    assert verdict.speedup == pytest.approx(HONEST, rel=0.03)


def test_a_shared_shrink_within_the_tolerance_moves_the_point_estimate_but_not_the_class_past_its_noise():
    """What (4) still gains: 0.01 ms off both sides (the reference 7% faster beside the candidate, inside the
    GPU's 10% tolerance) reads 1.57x (5% over the true), and the interval, widened by the reference's offset from
    the clean process, takes in the true 1.50x."""
    verdict = _judge(_both_shrunk(0.01))
    assert "reference_faster_beside_candidate" not in verdict.warnings
    assert verdict.speedup == pytest.approx((REF_MS - 0.01) / (TRUE_MS - 0.01), rel=0.02)
    low, high = verdict.speedup_ci
    assert low <= HONEST <= high


def test_a_shared_shrink_past_the_tolerance_reads_the_walls():
    """0.015 ms off both (the reference 11% faster beside): past the tolerance, the walls, with the harness's
    share in them, read below the truth rather than above it."""
    verdict = _judge(_both_shrunk(0.015))
    assert "reference_faster_beside_candidate" in verdict.warnings
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup)


# ---- what holds: a kind shrunk throughout is caught on its own, and does not drag the other ------------------

@pytest.mark.parametrize("shrunk_kind", ["device", "host"])
def test_a_kind_shrunk_in_every_round_reads_the_parents_clock_and_leaves_the_other_honest(shrunk_kind):
    rounds = _unexplained_rounds(REF_MS, TRUE_MS, TRUE_MS, n=200)
    for r in rounds:
        r[side_key("cand", shrunk_kind)] = [0.015] * 3
    verdict = _judge(rounds)
    clocks = verdict.timing["clocks"]
    assert clocks[shrunk_kind]["source"] == "net_wall"
    other = "host" if shrunk_kind == "device" else "device"
    assert clocks[other]["source"] == "worker"
    for clock, speedup in _speedups(verdict).items():
        assert speedup <= HONEST * GAIN_ALLOWED, (clock, speedup)
        assert speedup >= HONEST / GAIN_ALLOWED, (clock, speedup)  # nor is the honest kind misread


@pytest.mark.parametrize("claims_to_block", [False, True])
def test_the_mixture_gains_the_same_whatever_the_mode(claims_to_block):
    """The mode only picks the headline: a forged probe (sync mode) reads the host clock, which the mixture
    fools as it does the device clock, so the claim neither adds to nor takes from (1)."""
    probe = {"ref": _probe(False), "cand": _probe(claims_to_block)}
    verdict = _judge(_mixture(200, 0.015), probe=probe)
    assert verdict.timing["mode"] == ("sync" if claims_to_block else "hold")
    hold = _judge(_mixture(200, 0.015))
    assert verdict.speedup == pytest.approx(hold.speedup, rel=0.03)
