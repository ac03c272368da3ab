"""Whether the parent's clock confirms the timing worker's own times (SPEC §5): the judge's reading of the rounds
the parent drove (kbverify.timing.timing_control). Pure, no torch; thresholds from the protocol's rules (kbverify.core.rules).

The worker that times runs submission code, so its times are claims. The parent's wall time around each batch is
observed. What a side's claims leave of that wall unexplained is the same for both sides of an honest kernel; a
candidate whose batches leave much more is timed by the parent's clock instead (`device_time_unconfirmed`).
"""

from __future__ import annotations

import math

from kbverify.core.rules import Rules
from kbverify.timing.timing_control import KINDS, side_key


def unexplained_ms(rounds: list) -> dict:
    """Per call and side: the parent's wall time its own times leave unaccounted for, over all rounds and both
    kinds of batch."""
    out = {}
    for side in ("ref", "cand"):
        calls = wall = timed = 0.0
        for r in rounds:
            for kind in KINDS:
                times = r.get(side_key(side, kind), ())
                calls += len(times)
                wall += r.get(side_key(side, kind, "wall_ms"), 0.0)
                timed += sum(times)
        out[side] = (wall - timed) / calls if calls else None
    return out


def device_time_confirmed(rounds: list, rules: Rules, kinds=KINDS) -> tuple[bool, dict]:
    """Whether the parent's clock accounts for the candidate's device times as it does for the reference's.

    Per round, d = (what the candidate's batch left unexplained per call) - (the same for the reference's). An
    honest kernel whose host work the device-side hold covers has d about 0: both batches do the same harness
    work around calls that take what they say. Times shrunk by a factor k leave d = (1 - 1/k) of the true time.
    The device clock is not confirmed when d's median is, with 95% confidence, above `rules.unexplained_fraction`
    of the candidate's own claimed time (and above `rules.unexplained_min_ms`), or past it and above zero with 80%
    confidence: its speedup could then be inflated by more than that fraction. The test is on the median of paired
    rounds, so the harness's own jitter, however large next to a microsecond kernel, averages out instead of
    widening the allowance.

    `kinds`: the kinds of batch judged. Each clock is judged on its own kind's batches (kbverify.judge.timing):
    pooled, device-kind times inflated into the hold's share of their batch would pay for host-kind times shrunk
    tenfold (tests/test_timing_redteam_perkind.py:
    test_a_kind_shrunk_in_every_round_reads_the_parents_clock_and_leaves_the_other_honest)."""
    differences = _differences(_rounds_the_estimate_rests_on(rounds, kinds), kinds)
    seen = {**unexplained_ms(rounds), "rounds": len(_differences(rounds, kinds)), "judged_rounds": len(differences)}
    if not differences:
        return True, seen  # no batch of these kinds: no clock of them to confirm
    claimed = sorted(t for r in rounds for kind in kinds for t in r.get(side_key("cand", kind), ()))
    threshold = max(rules.unexplained_min_ms, rules.unexplained_fraction * claimed[len(claimed) // 2])
    n = len(differences)
    if n < rules.few_rounds:
        # too few for an order-statistic bound (with two it is their minimum, and one honest-looking round
        # vouched for a shrunk one: 4.5x; one round confirmed anything): every round must account for its times.
        # Few rounds in a budget means long calls, next to which the harness's jitter is small.
        seen.update({"median_difference_ms": differences[n // 2], "max_difference_ms": differences[-1],
                     "threshold_ms": threshold})
        return differences[-1] <= threshold, seen
    median = differences[n // 2]
    lower = _median_lower_bound(differences, 1.96)  # 95%
    # With few rounds (a short budget) the 95% bound rarely clears anything: a median past the threshold that is
    # above zero at 80% confidence is enough to fall back on the parent's clock, which is never an accusation.
    likely = median > threshold and _median_lower_bound(differences, 1.2816) > 0
    seen.update({"median_difference_ms": median, "lower_bound_ms": lower, "threshold_ms": threshold})
    return not (lower > threshold or likely), seen


def _median_lower_bound(ordered: list, z: float) -> float:
    """The order-statistic lower confidence bound of a median (normal approximation to the sign test)."""
    n = len(ordered)
    return ordered[max(0, int(n / 2 - z * math.sqrt(n) / 2) - 1)]


def _rounds_the_estimate_rests_on(rounds: list, kinds) -> list:
    """The rounds whose speedup is at least the median round's (of the kinds given): the speedup is a median of
    per-round ratios, so only those can have raised it. Judged over every round, times shrunk in just over half
    the rounds and padded a little in the rest (d below zero there) would hold the order-statistic bound of d's
    median at zero; a median moved by shrunk rounds needs more than half of them shrunk, and then this half is
    nearly all shrunk (tests/test_timing_redteam_perkind.py::
    test_shrinking_just_over_half_the_rounds_gains_nothing)."""
    scored = []
    for r in rounds:
        ref = [t for kind in kinds for t in r.get(side_key("ref", kind)) or ()]
        cand = [t for kind in kinds for t in r.get(side_key("cand", kind)) or ()]
        if ref and cand and min(cand) > 0:
            scored.append((sum(ref) / len(ref) / (sum(cand) / len(cand)), r))
    scored.sort(key=lambda pair: pair[0])
    return [r for _, r in scored[(len(scored) - 1) // 2:]]


def _differences(rounds: list, kinds) -> list:
    """Per round, sorted: the candidate's unexplained time per call less the reference's, over `kinds`."""
    pairs = ((_unexplained(r, "cand", kinds), _unexplained(r, "ref", kinds)) for r in rounds)
    return sorted(cand - ref for cand, ref in pairs if cand is not None and ref is not None)


def _unexplained(round_record: dict, side: str, kinds=KINDS) -> float | None:
    """One round's unexplained time per call of one side, over the kinds of batch given (the hold's length
    is in the device kind's, the same for both sides, so it cancels in the difference)."""
    calls = unexplained = 0.0
    for kind in kinds:
        times, wall = round_record.get(side_key(side, kind)), round_record.get(side_key(side, kind, "wall_ms"))
        if times and wall is not None:
            calls += len(times)
            unexplained += wall - sum(times)
    return unexplained / calls if calls else None
