"""Re-randomised weights through the candidate's own load_state_dict (kbverify.worker.construct): which names
they go under, what counts as the candidate refusing them, and what is redrawn."""

import pytest
import torch
import torch.nn as nn

from kbverify.core.protocols import KBV, VERIFIED
from kbverify.core.records import SetResult
from kbverify.core.status import Status
from kbverify.judge.rejudge import _wanted
from kbverify.worker.construct import WeightsRefused, load_weights, names_of
from kbverify.worker.evaluate import rerandomized_state


class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.gemm = nn.Linear(4, 3, bias=False)
        self.bias = nn.Parameter(torch.randn(3))


class Renamed(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(3, 4))
        self.b = nn.Parameter(torch.empty(3))


class Transposed(nn.Module):
    """Another layout: Model's gemm.weight kept transposed, translated by its load hook."""

    def __init__(self):
        super().__init__()
        self.weight_t = nn.Parameter(torch.zeros(4, 3))
        self.bias = nn.Parameter(torch.zeros(3))

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "gemm.weight" in state_dict:
            state_dict[prefix + "weight_t"] = state_dict.pop(prefix + "gemm.weight").t()
        super()._load_from_state_dict(state_dict, prefix, *args)


def _fresh(model: nn.Module) -> dict:
    return {key: torch.randn_like(value) for key, value in model.state_dict().items()}


def test_a_candidate_with_models_names_is_loaded_under_them_strictly():
    torch.manual_seed(0)
    reference, candidate = Reference(), Reference()
    state = _fresh(reference)
    names = names_of(candidate.state_dict(), reference.state_dict())
    assert names == {"gemm.weight": "gemm.weight", "bias": "bias"}
    assert load_weights(candidate, state, names) == "by_name"
    assert all(torch.equal(candidate.state_dict()[key], state[key]) for key in state)


def test_renamed_parameters_are_loaded_under_the_pairing_by_value():
    torch.manual_seed(0)
    reference = Reference()
    candidate = Renamed()
    with torch.no_grad():  # as built with Model's default weights handed over
        candidate.w.copy_(reference.gemm.weight)
        candidate.b.copy_(reference.bias)
    names = names_of(candidate.state_dict(), reference.state_dict())
    assert names == {"w": "gemm.weight", "b": "bias"}
    state = _fresh(reference)
    assert load_weights(candidate, state, names) == "by_value"
    assert torch.equal(candidate.w, state["gemm.weight"]) and torch.equal(candidate.b, state["bias"])


def test_another_layout_takes_models_names_through_its_hook():
    torch.manual_seed(0)
    reference, candidate = Reference(), Transposed()
    assert names_of(candidate.state_dict(), reference.state_dict()) is None
    state = _fresh(reference)
    assert load_weights(candidate, state, None) == "by_hook"
    assert torch.equal(candidate.weight_t, state["gemm.weight"].t())


def test_no_pairing_and_models_names_refused_is_unmapped_not_an_error():
    torch.manual_seed(0)
    reference, candidate = Reference(), Renamed()  # torch.empty: pairs with nothing
    assert names_of(candidate.state_dict(), reference.state_dict()) is None
    assert load_weights(candidate, _fresh(reference), None) is None


def test_a_refusal_under_the_candidates_own_names_is_the_candidates_failure():
    class Refuses(Reference):
        def load_state_dict(self, state_dict, strict=True, assign=False):
            raise RuntimeError("frozen")

    torch.manual_seed(0)
    reference, candidate = Reference(), Refuses()
    names = names_of(candidate.state_dict(), reference.state_dict())
    with pytest.raises(WeightsRefused, match="frozen"):
        load_weights(candidate, _fresh(reference), names)


def test_batchnorm_running_statistics_are_redrawn_and_masks_are_not():
    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(8)
            self.register_buffer("mask", torch.tril(torch.ones(4, 4)))

    model = Normed()
    state = rerandomized_state(model, seed=3)
    assert not torch.equal(state["bn.running_mean"], model.bn.running_mean)
    assert not torch.equal(state["bn.running_var"], model.bn.running_var)
    assert bool((state["bn.running_var"] > 0).all()), "a variance stays positive"
    assert torch.equal(state["mask"], model.mask)
    assert torch.equal(state["bn.num_batches_tracked"], model.bn.num_batches_tracked)


def _set(weights: str, distribution: str) -> SetResult:
    return SetResult(set_id=f"original/{distribution}/{weights}/s0", shape="original", distribution=distribution,
                     weights=weights, seed=1, valid=True, status=Status.PASSED, detail="")


def test_rejudge_keeps_the_load_state_dict_sets_where_the_protocol_asks_for_them():
    assert _wanted(_set("loaded", "x1"), VERIFIED)
    assert not _wanted(_set("loaded", "neg"), VERIFIED)  # not one of verified's loaded distributions
    assert not _wanted(_set("loaded", "x1"), KBV)


def _judged_set(weights: str, status: Status) -> SetResult:
    return SetResult(set_id=f"original/x1/{weights}/s0", shape="original", distribution="x1", weights=weights,
                     seed=0, valid=True, status=status, detail="norm-wise error 0.3")


def test_a_kernel_wrong_only_on_loaded_weights_is_named_stale_after_load():
    from kbverify.judge import aggregate_sets

    status, message, _ = aggregate_sets([_judged_set("default", Status.PASSED), _judged_set("rerandomized", Status.PASSED),
                                         _judged_set("loaded", Status.INCORRECT)], VERIFIED)
    assert status is Status.INCORRECT and message.startswith("stale_after_load")
    status, message, _ = aggregate_sets([_judged_set("default", Status.INCORRECT), _judged_set("loaded", Status.INCORRECT)],
                                        VERIFIED)
    assert status is Status.INCORRECT and not message.startswith("stale_after_load")


def test_every_parameter_is_redrawn_whatever_its_values_and_buffers_of_0_1_stay_masks():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))  # neither weight nor bias, ones: a parameter all the same
            self.alpha = nn.Parameter(torch.tensor(0.0))
            self.gamma = nn.Parameter(torch.tensor(1.0))
            self.register_buffer("keep", torch.tensor([0.0, 1.0, 1.0, 0.0]))

    model = Scaled()
    state = rerandomized_state(model, seed=5)
    for name in ("scale", "alpha", "gamma"):
        assert not torch.equal(state[name], getattr(model, name)), name
    # a parameter of ones takes random signs (trained weights are often negative; corpus
    # exploits/groupnorm_pool_before_signed_affine)
    assert bool((state["scale"] > 0).any()) and bool((state["scale"] < 0).any())
    assert torch.equal(state["keep"], model.keep)


def test_construction_never_hands_the_candidates_load_machinery_a_partial_state():
    from kbverify.worker.construct import construct_candidate

    seen = []

    class Hooked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)
            with torch.no_grad():
                self.lin.weight.normal_()  # replaced after the handover: the state must be loaded again

        def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
            seen.append(sorted(k[len(prefix):] for k in state_dict if k.startswith(prefix)))
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    state = _fresh(Hooked())
    seen.clear()

    def reseed():
        torch.manual_seed(0)
        return []

    candidate, how = construct_candidate(Hooked, reseed(), state, reseed=reseed)
    assert how == "by_name" and seen and all(keys == ["lin.bias", "lin.weight"] for keys in seen)
    assert all(torch.equal(candidate.state_dict()[k], v) for k, v in state.items())

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def _load_from_state_dict(self, *args, **kwargs):
            raise AssertionError("everything was handed over at construction: nothing to load")

    candidate, how = construct_candidate(Plain, [], _fresh(Plain()), reseed=lambda: [])
    assert how == "by_name"


def test_fresh_weights_failing_only_off_the_task_shape_are_incorrect_not_shape_specialised():
    from kbverify.judge import aggregate_sets

    def hidden(weights, status):
        return SetResult(set_id=f"hidden:0/x1/{weights}/s0", shape="hidden:0", distribution="x1", weights=weights,
                         seed=0, valid=True, status=status, detail="norm-wise error 0.3")

    status, _, _ = aggregate_sets([_judged_set("rerandomized", Status.PASSED), hidden("default", Status.PASSED),
                                   hidden("rerandomized", Status.INCORRECT)], VERIFIED)
    assert status is Status.INCORRECT
    status, _, _ = aggregate_sets([hidden("default", Status.INCORRECT), hidden("rerandomized", Status.INCORRECT)],
                                  VERIFIED)
    assert status is Status.SHAPE_SPECIALIZED
