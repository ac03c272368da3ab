"""The interleaved timing pipeline on the CPU: a known 2× case comes out as 2×, an A/A case as 1×."""

import pytest

from kbverify.core.protocols import VERIFIED
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import parse_task
from kbverify.harness.runner import CheckOptions, check
from kbverify.judge.timing import driven_rounds

pytestmark = pytest.mark.serial  # its verdicts are measured speeds: alone on the machine (.ci/run)

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, a, b):
        return torch.tanh(a @ b)

# The harness's own work between calls (drawing, checking and poisoning) leaves the caches cold for each call's
# first operation, on both sides alike, as a flushed GPU's L2 is; the candidate's second product then runs warm,
# so doing the work twice costs (w + c) / (2w + c) of the reference's speed, not one half. N is large enough that
# the cold start c is a few percent of the work w (one thread: 0.52 at 320, 0.51-0.52 at 384, 0.56-0.58 at 192).
N = 384

def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]

def get_init_inputs():
    return []
"""

TWICE = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, a, b):
        first = torch.tanh(a @ b)
        torch.tanh(a @ b)  # the same work again, thrown away: exactly twice the reference's
        return first
"""

SAME = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, a, b):
        return torch.tanh(a @ b)
"""

PROTOCOL = VERIFIED.with_overrides(timing_budget_s=1.5, hidden_shapes=False, distributions=("x1",),
                                   rerandomized_weights=False)


def _speed(source: str):
    task = parse_task(TASK, name="1_TanhMatmul", level=1, problem_id=1)
    verdict = check(task, make_submission(source, id="s.py"), PROTOCOL, CheckOptions(device="cpu", timeout_s=120))
    assert verdict.status.value == "passed", verdict.message
    return verdict


@pytest.mark.slow
def test_doing_the_work_twice_measures_as_half_the_speed():
    verdict = _speed(TWICE)
    low, high = verdict.speedup_ci
    assert low <= verdict.speedup <= high
    # The paired interval (both sides interleaved in one process) must hold the truth, 0.50-0.52 here, and be
    # centred on it whenever the machine let it be narrow; a stall that widens it (seen: [0.38, 2.7] once on a
    # loaded 2-core machine) is an imprecise measurement, honestly reported, not a wrong one. The verdict's
    # interval is the paired one widened by the instance differences: here the reference timed in the clean
    # process, seconds apart, differs from the one beside the candidate by up to 25% (machine drift counted as
    # an instance offset, conservatively), which can widen a true 2x to `ambiguous`, never past it.
    paired_low, paired_high = verdict.timing["clocks"]["device"]["instances"]["before_ci"]
    assert paired_low <= 0.53 and paired_high >= 0.49, (paired_low, paired_high)
    assert low <= paired_low <= verdict.speedup <= paired_high <= high
    if paired_high / paired_low < 1.2:
        assert 0.45 < verdict.speedup < 0.55, (verdict.speedup, verdict.timing["clocks"]["device"])
    assert verdict.speed_class in ("slower", "ambiguous"), verdict.speed_class
    # `slower` once the interval clears the noise band, which the A/A rounds may widen past the 10% floor on a
    # loaded machine (seen on CI: high < 0.9 against a wider band, read `ambiguous`)
    margin = verdict.timing.get("noise_margin", 0.1)
    if high < 1.0 - margin:
        assert verdict.speed_class == "slower", (verdict.speedup_ci, margin)
    # the budget is a cap on when the last round may start (a round the machine stalls still ends, and the
    # harness's own work between rounds counts too, so a loaded 2-core machine gets some slack); what the parent
    # does after the last round is not the stopping rule's (a 0.4 s stall there once failed a bound on the whole)
    record = verdict.timing["interleaved"]
    rounds = driven_rounds(verdict.timing)

    def round_s(r) -> float:
        # a CPU runs the device kind alone (runner._kinds): no host-kind walls there
        # each batch's span: its draws, its calls (the wall its times are held to), its checks and the hand-over of
        # its chosen copies (`reveal_ms`, inside the candidate's span)
        assert r["ref_span_ms"] >= r["ref_wall_ms"] and r["cand_span_ms"] >= r["cand_wall_ms"] + r.get("reveal_ms", 0)
        return (r["ref_span_ms"] + r["cand_span_ms"] + r.get("ref_host_span_ms", 0.0) + r.get("cand_host_span_ms", 0.0)
                + r["between_ms"]) / 1e3

    def hand_over_s(r) -> float:
        return (r.get("reveal_ms", 0) + r.get("reveal_host_ms", 0)) / 1e3

    # the hand-over of the chosen copies is the check's time, not the rounds': the budget leaves it out
    last_started_s = (sum(round_s(r) - hand_over_s(r) for r in rounds[:-1]) + rounds[-1]["between_ms"] / 1e3)
    assert last_started_s <= PROTOCOL.timing_budget_s + 0.2
    # every millisecond of the timed span is accounted for by the parent, round by round: both sides' batches of
    # both kinds, the reveal of the checked calls, and its own work between rounds (where a lazy import once spent
    # half the budget unseen); the worker's own span adds only the messages around them
    accounted_s = sum(round_s(r) for r in rounds)
    assert accounted_s <= record["timing_s"] + 0.01 <= accounted_s + 0.06 + 0.01 * len(rounds)
    assert max(r["between_ms"] for r in rounds) < 100, "the stopping rule's imports must be done before"


def test_no_round_starts_that_would_end_past_the_budget():
    from kbverify.timing.timing_control import no_time_for_another_round as _no_time_for_another_round

    assert not _no_time_for_another_round(1.0, 10, 2.0)  # 0.1 s rounds: room for more
    assert not _no_time_for_another_round(1.9, 19, 2.0)  # the next one ends at 2.0 exactly
    assert _no_time_for_another_round(1.95, 19, 2.0)  # it would end at 2.05
    assert _no_time_for_another_round(1.2, 1, 2.0)  # one long round: a second would overrun
    assert _no_time_for_another_round(0.0, 0, 2.0) is False


@pytest.mark.slow
def test_the_same_work_measures_as_the_same_speed():
    verdict = _speed(SAME)
    assert 0.85 < verdict.speedup < 1.15, verdict.speedup
    assert verdict.speed_class in ("same", "ambiguous")


def _bare_cover():
    from kbverify.worker.timed_call import Cover

    cover = object.__new__(Cover)  # no device to calibrate against on the CPU: the length rule alone
    cover.probing, cover.host_ms, cover.fixed_ms, cover.cycles_per_ms = True, [], Cover.CAP_MS, 1.0
    cover.probe_ms = Cover.CAP_MS
    return cover


def test_the_hold_is_set_from_the_warm_up_calls_that_ended_before_it():
    cover = _bare_cover()
    assert cover.length_ms == cover.CAP_MS  # warm-up: the longest hold
    assert cover.observe(0.2) == 0 and cover.observe(0.3) == 0
    assert cover.observe(cover.CAP_MS + 5) == 1  # waited on the device (or compiled): no evidence of host time
    cover.fix_length()
    assert cover.length_ms == pytest.approx(cover.MARGIN * 0.3)
    assert cover.observe(0.1) == 0 and cover.observe(1.0) == 1
    assert cover.length_ms == pytest.approx(cover.MARGIN * 0.3)  # fixed for the timed rounds, both sides alike


def test_a_forward_that_ends_with_its_hold_does_not_set_the_hold():
    """On the H200 a forward that synchronised inside read 19.9 ms against a 20 ms hold (the hold runs a little
    short when the clock is faster than calibrated) and fixed every later hold at the cap; it ends with the hold
    whatever its length, so it says nothing about host work, at either probe length."""
    cover = _bare_cover()
    for calls in range(6):
        cover.probe_ms = cover.CAP_MS if calls % 2 == 0 else cover.PROBE_SHORT_MS
        cover.observe(cover.probe_ms * 0.995)  # the blocked side
        cover.observe(0.3 if calls else 2.0)  # the other side's launches
    cover.fix_length()
    assert cover.length_ms == pytest.approx(cover.MARGIN * 0.3)
    both_blocked = _bare_cover()
    for calls in range(6):
        both_blocked.probe_ms = both_blocked.CAP_MS if calls % 2 == 0 else both_blocked.PROBE_SHORT_MS
        both_blocked.observe(both_blocked.probe_ms * 0.99)
        both_blocked.observe(both_blocked.probe_ms * 1.01)
    both_blocked.fix_length()
    assert both_blocked.length_ms == pytest.approx(both_blocked.FLOOR_MS)


def test_the_first_call_of_each_side_does_not_set_the_hold_but_a_later_outlier_does():
    cover = _bare_cover()
    for host_ms in (1.4, 0.9, 0.3, 0.25, 0.3, 0.2):  # ref and cand's first calls pay one-time costs
        cover.observe(host_ms)
    cover.fix_length()
    assert cover.length_ms == pytest.approx(cover.MARGIN * 0.3)
    later = _bare_cover()
    for host_ms in (1.4, 0.9, 0.3, 0.8, 0.3, 0.2):
        later.observe(host_ms)
    later.fix_length()
    assert later.length_ms == pytest.approx(later.MARGIN * 0.8)


def test_a_forward_that_always_waits_on_the_device_keeps_the_hold_at_its_floor():
    cover = _bare_cover()
    for _ in range(5):
        cover.observe(cover.CAP_MS + 0.4)  # host time is always the hold plus what follows the wait
    cover.fix_length()
    assert cover.length_ms == cover.FLOOR_MS


def test_each_call_gets_its_own_tensors_or_the_previous_calls_refilled():
    import torch

    from kbverify.worker.timing_sides import Side

    side = Side("cand", torch.nn.Identity(), {}, torch.device("cpu"), "secret", grad=False)
    seen_fresh = seen_refilled = False
    for call in range(40):
        base = torch.full((3, 4), float(call))
        staged = [torch.full((4, 3), float(call)), 7, [torch.full((2,), float(call))], base.t(),
                  torch.full((2,), float(call)).requires_grad_()]
        placed = side.place(staged)
        assert placed[0] is not staged[0] and torch.equal(placed[0], staged[0]) and placed[1] == 7
        assert placed[2][0] is not staged[2][0] and torch.equal(placed[2][0], staged[2][0])  # nested: refilled
        assert placed[3] is not staged[3] and placed[3].stride() == staged[3].stride()  # layout kept
        assert torch.equal(placed[3], staged[3])
        assert placed[4].requires_grad and torch.equal(placed[4].detach(), staged[4].detach())
        if call and placed[0] is previous:
            seen_refilled = True
        elif call:
            seen_fresh = True
        previous = placed[0]
    assert seen_fresh and seen_refilled


def test_placement_jitter_allocates_a_spacer_of_varying_size_before_each_calls_tensors():
    import torch

    from kbverify.worker.timing_sides import Side

    side = Side("ref", torch.nn.Identity(), {}, torch.device("cpu"), "secret", grad=False)
    side.place([torch.zeros(4)])
    assert side.spacer is None  # off unless asked for
    side.jitter_bytes = 1 << 16
    sizes = set()
    for _ in range(20):
        side.place([torch.zeros(4)])
        assert 512 <= side.spacer.numel() <= (1 << 16) + 512 and side.spacer.numel() % 512 == 0
        sizes.add(side.spacer.numel())
    assert len(sizes) > 5


def test_aliased_inputs_and_parameters_go_to_the_call_as_drawn():
    import torch

    from kbverify.worker.timing_sides import Side

    side = Side("cand", torch.nn.Identity(), {}, torch.device("cpu"), "secret", grad=False)
    x = torch.randn(4, 4)
    weight = torch.nn.Parameter(torch.randn(3))
    placed = side.place([x, x[1], weight, torch.empty(0)])
    assert placed[0] is x and placed[1] is not None and placed[1].data_ptr() == x[1].data_ptr()
    assert placed[2] is weight


def test_poison_spares_a_tensor_the_model_owns_and_fills_the_rest():
    import torch

    from kbverify.worker.timing_sides import own_storages, poison

    model = torch.nn.Linear(3, 2)
    fresh = torch.ones(2, 2)
    poison([model.weight.detach()[0], fresh], own_storages(model))
    assert torch.isfinite(model.weight).all()
    assert torch.isnan(fresh).all()


def test_the_checked_calls_are_a_uniform_sample_of_the_whole_run():
    import random

    from kbverify.timing.timing_control import STALE_CHECKS, Reservoir

    calls, early_half = 1000, 0
    for trial in range(5):
        reservoir = Reservoir(random.Random(trial))
        for index in range(calls):
            if reservoir.offer(index):
                reservoir.keep(index, {})
        assert len(reservoir.sample) == STALE_CHECKS
        early_half += sum(index < calls // 2 for index in reservoir.sample)
    # about half of 5 x 24 = 60 in the first half; evicting at random on every call kept none of them
    assert early_half >= 35


LAZY_LIST = """
import torch
import torch.nn as nn

class _Out(list):
    def __init__(self, a, b):
        super().__init__([torch.empty(a.shape[0], b.shape[1])])
        self._operands = (a, b)

    def __iter__(self):
        if self._operands is not None:
            a, b = self._operands
            torch.matmul(a, b, out=self[0])  # all the work, once the harness iterates the result
            self._operands = None
        return super().__iter__()

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _Out(a, b)
"""


def test_work_hidden_in_a_returned_containers_iter_is_timed():
    from kbverify.core.submissions import make_submission

    verdict = check(parse_task(TASK, name="1_TanhMatmul", level=1, problem_id=1),
                    make_submission(LAZY_LIST.replace("torch.matmul(a, b, out=self[0])",
                                                      "torch.tanh(a @ b, out=self[0])"), id="lazy.py"),
                    PROTOCOL, CheckOptions(device="cpu", timeout_s=120))
    # a list subclass where the reference returns a tensor is another structure (kbverify.core.output_structure);
    # where a container passes, the work in its __iter__ is inside the clock (before, it stopped first: 86x)
    assert verdict.status.value in ("shape_mismatch", "passed"), verdict.message
    assert verdict.status.value == "shape_mismatch" or verdict.speedup < 1.5


SYNC = CheckOptions(device="cpu", timeout_s=120, timing_mode="sync")


def _speed_in_sync_mode(source: str):
    task = parse_task(TASK, name="1_TanhMatmul", level=1, problem_id=1)
    # both kinds of batch in every round: half the rounds of each a budget buys, so a longer budget
    verdict = check(task, make_submission(source, id="s.py"), PROTOCOL.with_overrides(timing_budget_s=3.0), SYNC)
    assert verdict.status.value == "passed", verdict.message
    assert verdict.timing["mode"] == "sync" and verdict.timing["clock_used"] in ("host", "wall")
    return verdict


@pytest.mark.slow
def test_the_known_2x_and_the_a_a_hold_in_sync_mode():
    """Both sides timed the host kind's way (no hold, each call synchronised): what a blocked forward gets. On a
    CPU the two kinds measure alike, so this holds the whole host-kind path (the parent's batches, the worker's
    calls, the clocks) to the same 2x and 1x the device kind gives."""
    twice = _speed_in_sync_mode(TWICE)
    # half as many rounds of each kind as the device kind alone gets, on a shared 2-core machine: a little wider
    # than the device kind's own test (the second call of the same work also finds warm caches on a CPU)
    assert 0.45 < twice.speedup < 0.6, twice.speedup
    host, device = twice.timing["clocks"]["host"], twice.timing["clocks"]["device"]
    assert host["speedup"] == twice.speedup and host["n_rounds"] == len(driven_rounds(twice.timing))
    # the two kinds time the same calls the same way here: their intervals meet
    assert host["ci"][0] <= device["ci"][1] and device["ci"][0] <= host["ci"][1], (host, device)
    same = _speed_in_sync_mode(SAME)
    assert 0.85 < same.speedup < 1.15, same.speedup
    assert same.speed_class in ("same", "ambiguous")


@pytest.mark.slow
def test_every_round_draws_one_of_the_correctness_distributions_in_turn():
    """The parent names each round's distribution (every call of the round draws it), in turn from a random
    start, over the protocol's own list, mixed signs included; the checked timed calls carry it to the stale
    check, which must then find the honest kernel's outputs right on those inputs."""
    distributions = ("x1", "neg", "shifted", "mixed_sign")
    protocol = PROTOCOL.with_overrides(distributions=distributions, timing_budget_s=1.0)
    task = parse_task(TASK, name="1_TanhMatmul", level=1, problem_id=1)
    verdict = check(task, make_submission(SAME, id="s.py"), protocol, CheckOptions(device="cpu", timeout_s=120))
    assert verdict.status.value == "passed", verdict.message
    drawn = [r["distribution"] for r in driven_rounds(verdict.timing)]
    start = distributions.index(drawn[0])
    assert drawn == [distributions[(start + i) % len(distributions)] for i in range(len(drawn))]
    assert verdict.timing["timed_outputs"]["checked"] > 0
