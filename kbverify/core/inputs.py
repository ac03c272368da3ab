"""Input sets: a shape configuration × a value distribution × a weight regime × a seed (SPEC §3).

Planning (which sets exist) is pure and runs in the parent; drawing runs in workers, on the device, once per
seed, with the other distributions derived from that one draw. Distributions touch floating tensors only:
integer and bool inputs keep their dtype and values.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, dataclass, field

KERNELBENCH_SEED = 42


@dataclass(frozen=True)
class InputSet:
    set_id: str
    shape: str  # "original" | "hidden:<n>"
    distribution: str
    weights: str  # "default" | "rerandomized" (at construction) | "loaded" (through load_state_dict)
    seed: int  # drives get_inputs() and the per-call RNG reseed
    weight_seed: int
    overrides: dict = field(default_factory=dict)  # the hidden shape's constant values
    # "loaded" sets only: "call_first" (built, called once, then loaded: a copy derived at the first call goes
    # stale) or "load_first" (built, loaded, then called: a user's order, which a copy refreshed only after a
    # call gets wrong)
    load_order: str = ""
    # run as a user's script runs it (kbverify.worker.as_user): a fresh process, the collector on, no harness frame
    as_user: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


# The last part of the id of the set run as a user calls it: a verdict that it decides names it.
AS_USER_TAG = "as-a-user-calls-it"


def derive_seed(secret: str, *parts) -> int:
    digest = hashlib.sha256("/".join([secret, *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def new_run_secret() -> str:
    return secrets.token_hex(8)


LOAD_ORDERS = ("call_first", "load_first")


def plan_input_sets(protocol, shapes: list[tuple[str, dict]], *, secret: str) -> list[InputSet]:
    """Every input set a protocol asks for. `shapes` = [("original", {}), ("hidden:0", {...}), ...]. Set ids do not
    depend on the secret (a run can be narrowed to one by id); seeds and the loaded sets' order do."""
    plan = []
    # the loaded sets take the two orders in turn, from a first one the secret picks: both are tried in every
    # run with two loaded sets or more, and which set gets which cannot be known in advance
    orders = _alternating(LOAD_ORDERS, derive_seed(secret, "load-order"))
    hidden = 0
    for shape, overrides in shapes:
        for trial in range(protocol.trials):
            if protocol.seeds == "kernelbench":
                seed, weight_seed = kernelbench_trial_seeds(protocol.trials)[trial], KERNELBENCH_SEED
                loaded_secret = str(KERNELBENCH_SEED)
            else:
                seed, weight_seed = derive_seed(secret, "input", trial), derive_seed(secret, "weights", trial)
                loaded_secret = secret
            for weights, distribution in _combinations(protocol, shape, hidden):
                set_id = f"{shape}/{distribution}/{weights}/s{trial}"
                order, own_seed = "", weight_seed
                if weights == "loaded":
                    # weights of their own, never handed over at any construction in the same process: a
                    # candidate that recognises weights it was built with (a table of packings) meets new ones
                    order = next(orders)
                    own_seed = derive_seed(loaded_secret, "loaded-weights", shape, trial, distribution)
                plan.append(InputSet(set_id, shape, distribution, weights, seed, own_seed, dict(overrides), order))
        hidden += shape != "original"
    return plan + _as_user_set(protocol, secret)


def _as_user_set(protocol, secret: str) -> list[InputSet]:
    """A guarded protocol's one set run as a user's script calls the model (kbverify.worker.as_user): the task's
    shape, the default weights, trial 0's seeds, and mixed signs where the protocol has them (the task's own
    inputs are often all positive, on which a kernel that returns its input passes for a ReLU), so it draws what
    `original/mixed_sign/default/s0` draws.
    A kernel that computes honestly only while it is watched (the collector off, the harness's frames above it)
    fails it alone, and the verdict names it (corpus: exploits/relu_honest_only_while_the_collector_is_off).
    Last in the plan, so that a kernel wrong everywhere is named by the sets the harness calls; yet both workers
    take it first (kbverify.worker.evaluate): the candidate runs it before it loads the submission itself."""
    if not protocol.guards or not protocol.isolated or not protocol.as_user_set:
        return []
    distribution = next((d for d in ("mixed_sign", "x1") if d in protocol.distributions), protocol.distributions[0])
    seed, weight_seed = derive_seed(secret, "input", 0), derive_seed(secret, "weights", 0)
    if protocol.seeds == "kernelbench":
        seed, weight_seed = kernelbench_trial_seeds(protocol.trials)[0], KERNELBENCH_SEED
    return [InputSet(f"original/{distribution}/default/{AS_USER_TAG}", "original", distribution, "default", seed,
                     weight_seed, {}, "", True)]


def _combinations(protocol, shape: str, hidden: int) -> list[tuple[str, str]]:
    """The (weights, distribution) pairs of one shape; `hidden`: how many hidden shapes come before it."""
    combinations = [("default", d) for d in protocol.distributions]
    if not protocol.rerandomized_weights:
        return combinations
    rerandomized = [("rerandomized", d) for d in protocol.rerandomized_distributions if d in protocol.distributions]
    loaded = [("loaded", d) for d in protocol.loaded_distributions if d in protocol.distributions]
    if shape == "original":
        # fresh weights expose kernels that assume the default initialisation; a few distributions at the task's
        # own shapes are enough for that, and every set costs a full run on a big task. Then again through
        # load_state_dict after construction: a kernel that looked at the values it was built with (skipping an
        # affine of ones and zeros, a copy derived once) fails these
        return combinations + rerandomized + loaded
    # Off the task's shape, one set of fresh weights per shape (the regimes in turn over the hidden shapes):
    # with default weights alone there, a kernel could drop an affine on every input but the task's own.
    turn = [regime[:1] for regime in (rerandomized, loaded) if regime]
    return combinations + (turn[hidden % len(turn)] if turn else [])


def _alternating(values: tuple, start: int):
    position = start % len(values)
    while True:
        yield values[position]
        position = (position + 1) % len(values)


# torch.manual_seed(42) then torch.randint(0, 2**32 - 1, (1,)) per trial, as KernelBench derives its trial seeds.
# Kept as data so the parent never imports torch; tests/test_tasks_protocols.py recomputes them with torch.
KERNELBENCH_TRIAL_SEEDS = (734796314, 576165995, 2197670066, 839703249, 2584932063, 1099380392, 2221926164,
                           858498508, 3195377610, 1541725978)


def kernelbench_trial_seeds(trials: int) -> list[int]:
    if trials > len(KERNELBENCH_TRIAL_SEEDS):
        raise ValueError(f"at most {len(KERNELBENCH_TRIAL_SEEDS)} KernelBench trials are tabulated")
    return list(KERNELBENCH_TRIAL_SEEDS[:trials])


# ---- worker side -------------------------------------------------------------------------------------------

SHIFT = 100.0
WIDE_LARGE, WIDE_SMALL = 1e5, 1e-5  # past fp16's 65504 and into its subnormals; plain fp32 values


def draw_inputs(namespace: dict, seed: int, device) -> list:
    """One draw of get_inputs(), made on the device (torch factories follow the default device)."""
    import torch

    from kbverify.worker.worker import set_seed  # workers only: the parent never draws inputs

    set_seed(seed)
    with torch.device(device):
        raw = namespace["get_inputs"]()
    return [value.to(device) if isinstance(value, torch.Tensor) else value for value in raw]


def timed_inputs(namespace: dict, seed: int, distribution: str, device) -> list:
    """A timed call's inputs: the draw for the parent's seed, under the distribution the parent chose for it (the
    correctness sets' own), so timed calls cannot be told from checked ones by their values. The timing worker
    and the stale check (which compares the call with the reference) both draw through here."""
    raw = draw_inputs(namespace, seed, device)
    return raw if distribution == "x1" else apply_distribution(raw, distribution, seed)


def apply_distribution(inputs: list, distribution: str, seed: int) -> list:
    """Derive a distribution's inputs from the x1 draw. Returns new tensors; the draw is untouched."""
    import torch

    out = []
    for index, value in enumerate(inputs):
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            out.append(value.clone() if isinstance(value, torch.Tensor) else value)
            continue
        out.append(_transform(value, distribution, _mask_seed(distribution, seed, index)))
    return out


def _mask_seed(distribution: str, seed: int, index: int) -> int:
    """The seed of input `index`'s element mask, where a distribution has one: each distribution its own, so that
    the mixed-sign set's signs do not follow the wide set's magnitudes."""
    return derive_seed(str(seed), distribution, index)


def _transform(x, distribution: str, mask_seed: int):
    import torch

    if distribution == "x1":
        return x.clone()
    if distribution == "x3":
        return x * 3.0
    if distribution == "x0.01":
        return x * 0.01
    if distribution == "neg":
        return -x
    if distribution == "shifted":
        # mean far from zero relative to spread: exposes E[x²]−E[x]² style cancellation
        return x + SHIFT
    if distribution == "wide":
        # values fp32 handles and fp16 cannot: some overflow fp16's 65504 once multiplied, others flush to zero
        generator = torch.Generator(device=x.device).manual_seed(mask_seed)
        large = torch.rand(x.shape, generator=generator, device=x.device) < 0.5
        if x.dtype in (torch.float32, torch.float64) and x.is_contiguous():
            # The same products (x times the factor rounded to x's dtype, as a Python scalar is for these dtypes),
            # with one full-size temporary instead of three: a KernelBench input is gigabytes.
            return torch.full_like(x, WIDE_SMALL).masked_fill_(large, WIDE_LARGE).mul_(x)
        return torch.where(large, x * WIDE_LARGE, x * WIDE_SMALL)
    if distribution == "mixed_sign":
        # every element's sign drawn on its own: every other set is a positive scaling, shift or negation of one
        # draw, so a torch.rand input keeps one sign throughout and one element's sign could decide a ReLU.
        # Multiplying by ±1 is exact in every floating dtype, so magnitudes stay those of the draw.
        generator = torch.Generator(device=x.device).manual_seed(mask_seed)
        negative = torch.rand(x.shape, generator=generator, device=x.device) < 0.5
        return torch.ones_like(x).masked_fill_(negative, -1.0).mul_(x)
    raise ValueError(f"unknown distribution {distribution!r}")


def clone_inputs(inputs: list) -> list:
    import torch

    return [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
