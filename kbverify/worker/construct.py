"""ModelNew built and given the reference's weights, by the two routes SPEC §2 names: at construction (each weight
handed over as `__init__` creates it, `kbverify.worker.handover`, the rest loaded after) and through the built
model's own `load_state_dict`, how users load trained weights into a drop-in replacement.

The second route is what a kernel that looks at the values it is built with cannot pass: one that skips the affine
because its weights are ones and zeros at construction, one that derives a copy in `__init__` (or at its first
call) and never again, one whose `load_state_dict` ignores what it is given. A derived copy is honest when it
follows the weights the model holds: derived again in a load hook, or in `forward`.
"""

from __future__ import annotations

from typing import Callable

import torch

from kbverify.worker.handover import Construction, HandoverPlan


def _matches(target: torch.nn.Module, state: dict) -> bool:
    own = target.state_dict()
    return own.keys() == state.keys() and all(own[k].shape == state[k].shape for k in own)


def construct_candidate(ModelNew: type, init_inputs: list, state: dict, *,
                        default_state: Callable[[], dict] | None = None,
                        reseed: Callable[[], list] | None = None) -> tuple[torch.nn.Module, str | None]:
    """ModelNew built with the reference's weights: handed over as `__init__` assigns them, then the rest loaded.
    Returns the model and how the weights reached it: "by_name" (the state_dicts match), "by_value" (other names,
    but ModelNew's own initialisation under the shared seed equals Model's `default_state()` entry for entry, and
    that equality says which entry is which), or None. `reseed()` puts the generators back where they were when
    `init_inputs` had just been made and returns a fresh copy of them (an `__init__` may consume its arguments);
    without it nothing is built twice.

    Without the match by value, renaming every parameter would keep re-randomised weights away from a kernel, and
    with them the checks that catch one assuming the default initialisation (an affine left out, say)."""
    candidate, delivered, plan = _built(ModelNew, init_inputs, state)
    if _matches(candidate, state):
        if reseed is not None and plan.worth_replaying(state, delivered):
            init_inputs = reseed()
            candidate, delivered, _ = _built(ModelNew, init_inputs, state, plan)
        else:
            plan = None
        return _load_rest(ModelNew, init_inputs, state, candidate, delivered, reseed, plan), "by_name"
    if default_state is None or reseed is None:
        return candidate, None
    renamed = _state_by_value(candidate.state_dict(), state, default_state())
    if renamed is None:
        return candidate, None
    init_inputs = reseed()  # the same draws as the first construction, so what __init__ derives is derived alike
    # the plan's entries are the candidate's own names, which `renamed` uses: it replays as it is
    plan = plan if plan.worth_replaying(renamed, delivered) else None
    candidate, delivered, _ = _built(ModelNew, init_inputs, renamed, plan)
    if not _matches(candidate, renamed):
        return candidate, None
    return _load_rest(ModelNew, init_inputs, renamed, candidate, delivered, reseed, plan), "by_value"


def _built(ModelNew: type, init_inputs: list, state: dict,
           plan: HandoverPlan | None = None) -> tuple[torch.nn.Module, set[str], HandoverPlan]:
    """ModelNew built with `state` handed over as it is created (`kbverify.worker.handover`): at the top level only, or,
    with a plan recorded by an earlier build from the same seed, wherever the plan says."""
    construction = Construction(state, ModelNew, plan)
    with construction:
        candidate = ModelNew(*init_inputs)
    return candidate, construction.delivered, construction.plan_for(candidate)


def _load_rest(ModelNew: type, init_inputs: list, state: dict, candidate: torch.nn.Module, delivered: set[str],
               reseed: Callable[[], list] | None, plan: HandoverPlan | None = None) -> torch.nn.Module:
    """Load the state when __init__ did not receive an entry, or received it but then replaced it by something
    that does not depend on it (`reset_parameters()`, an `nn.init` call); otherwise load nothing, and what it
    derived from what it received (a constant folded in place, a normalised copy) stays. The two are told apart
    by building once more, from the same seed, with other values handed over, and seeing which entries follow
    them."""
    own = candidate.state_dict()
    changed = [key for key in delivered if key in own
               and not torch.equal(own[key], state[key].to(own[key].device, own[key].dtype))]
    replaced = set()
    if changed:
        if reseed is None:
            replaced = set(changed)  # cannot tell: the weights checked with win
        else:
            other = {key: _perturbed(value) for key, value in state.items()}
            try:
                probe = _built(ModelNew, reseed(), other, plan)[0].state_dict()
                replaced = {key for key in changed if key in probe and torch.equal(probe[key], own[key])}
            except Exception:  # noqa: BLE001 - the probe's values broke __init__: keep what it derived
                replaced = set()
            # the kept model is the last one built: module-level state and the generators are its own
            candidate, delivered, _ = _built(ModelNew, reseed(), state, plan)
    # The candidate's own load machinery sees a whole state or nothing: a `_load_from_state_dict` hook reads its
    # own entries, as a user's load of Model's state_dict always provides them, and a partial dict breaks it.
    # The whole state also re-derives, in such a hook, what __init__ derived from the entries it is given.
    if any(key not in delivered or key in replaced for key in state):
        candidate.load_state_dict(state, strict=False)
    return candidate


def _perturbed(value):
    """Other values of the same kind for the probe construction: shifted by one place (so a clamp, a sign or an
    all-equal tensor still sees a change) and, for floating tensors, mapped through -2x-1 in float32 (float8 has
    no arithmetic of its own)."""
    if not isinstance(value, torch.Tensor) or value.numel() < 2 and not value.is_floating_point():
        return value
    rolled = value.flatten().roll(1).view_as(value)
    if value.is_floating_point():
        return (-2 * rolled.float() - 1).to(value.dtype)
    return rolled


def _state_by_value(own: dict, state: dict, default: dict) -> dict | None:
    """`state` under the candidate's names (see `pairing`)."""
    names = pairing(own, state, default)
    return None if names is None else {own_key: state[key] for own_key, key in names.items()}


def pairing(own: dict, state: dict, default: dict) -> dict[str, str] | None:
    """Which of Model's entries each of the candidate's is: the one entry of Model's that has its shape, dtype
    and, under the shared seed, its exact initial value (Model's default, or the value already handed over where a
    name matched); None when an entry has no such partner or more than one (two BatchNorm weights both initialised
    to ones, say), since a wrong pairing would fail an honest kernel."""
    if len(own) != len(state) or set(state) != set(default):
        return None
    names: dict[str, str] = {}
    for own_key, own_value in own.items():
        initial = own_value.detach().to("cpu")
        partners = [key for key, value in state.items()
                    if value.shape == own_value.shape and value.dtype == own_value.dtype
                    and (torch.equal(initial, default[key].detach().to("cpu"))
                         or torch.equal(initial, value.detach().to("cpu")))]
        if len(partners) != 1 or partners[0] in names.values():
            return None
        names[own_key] = partners[0]
    return names


# ---- the route users load trained weights by ----------------------------------------------------------------

class WeightsRefused(Exception):
    """The candidate's own `load_state_dict` raised on a state laid out as its own state_dict is."""


def names_of(own: dict, default: dict) -> dict[str, str] | None:
    """Model's name for each of the candidate's entries, for a candidate built with Model's default weights handed
    over: the same name where the state_dicts match (keys and shapes), else the pairing by value; None when
    neither holds."""
    if own.keys() == default.keys() and all(own[k].shape == default[k].shape for k in own):
        return {key: key for key in own}
    return pairing(own, default, default)


def load_weights(candidate: torch.nn.Module, state: dict, names: dict[str, str] | None) -> str | None:
    """`state` (Model's entries under Model's names) given to a built candidate through its own
    `load_state_dict`, strictly, as a user loads trained weights into a drop-in replacement. Where the candidate's
    names are known (`names_of`), under those names: its own layout, so a refusal is the candidate's failure
    (WeightsRefused). Where they are not, under Model's names: a candidate that keeps a parameter in another
    layout accepts them by translating in its own `_load_from_state_dict` or `load_state_dict`. Returns the
    route ("by_name", "by_value", "by_hook"); None when no pairing is known and Model's names are refused (its
    parameters cannot be mapped)."""
    if names is not None:
        try:
            candidate.load_state_dict({own: state[key] for own, key in names.items()}, strict=True)
        except Exception as error:  # noqa: BLE001 - untrusted code: a refusal is data
            raise WeightsRefused(f"{type(error).__name__}: {str(error)[:600]}") from None
        return "by_name" if all(own == key for own, key in names.items()) else "by_value"
    try:
        candidate.load_state_dict(state, strict=True)
    except Exception:  # noqa: BLE001 - Model's names are not this candidate's: not mapped, which is a verdict
        return None
    return "by_hook"
