"""Protocols: frozen, named sets of evaluation rules. Data, not code paths (SPEC §2).

A user protocol is a JSON file `{"base": "verified", "name": "...", <field>: <value>, ...}`; every field of
`Protocol` may be overridden, nothing else exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.core.inputs import KERNELBENCH_TRIAL_SEEDS
from kbverify.core.rules import DEFAULT_RULES, Rules

# mixed_sign: per-element random signs (SPEC §3); the verified preset uses every distribution
ALL_DISTRIBUTIONS = ("x1", "x3", "x0.01", "neg", "shifted", "wide", "mixed_sign")


@dataclass(frozen=True)
class Protocol:
    name: str
    # correctness
    rule: str  # "allclose": torch.allclose(ref, cand, atol, rtol); "verified": element + norm + baseline allowance
    atol: float
    rtol: float
    norm_rtol: float | None  # norm-wise ‖c − r‖/‖r‖ bound ("verified" only)
    baseline_allowance: float | None  # candidate may err this many times the TF32 baseline's own error
    reference_tf32: bool  # reference for correctness computed with TF32 (matmul and cuDNN)
    reference_cudnn_tf32: bool  # PyTorch's default leaves cuDNN TF32 on; exact-fp32 turns it off
    trials: int  # seeds per input configuration
    seeds: str  # "kernelbench": 42 and its derived trial seeds; "secret": per-run secret seeds
    distributions: tuple[str, ...]
    hidden_shapes: bool
    shape_specialized_fails: bool
    rerandomized_weights: bool
    rerandomized_distributions: tuple[str, ...]  # re-randomised weights are tried on these, at the task's own shapes
    isolated: bool  # candidate in its own process on its own inputs; False = KernelBench's shared namespace
    guards: bool
    train_mode: bool  # KernelBench leaves both models in training mode
    # timing
    timing: str  # "kernelbench": warm-ups + trials, mean, same inputs; "interleaved": SPEC §5
    warmup_calls: int
    device_warmup_s: float  # run the model this long before the warm-up calls, so clocks are up (0: KernelBench)
    timing_trials: int
    baseline_matmul_tf32: bool
    baseline_cudnn_tf32: bool
    candidate_grad_enabled: bool  # KernelBench timed the candidate with autograd on
    timing_budget_s: float  # interleaved: stop at this many seconds of timing per task
    ci_half_width: float  # interleaved: stop when the 95% CI half-width on log-speedup is below this
    # scoring
    samples: str  # "first" | "best"
    exclude_degenerate: bool
    # re-randomised weights given to the built candidate through its own load_state_dict (how users load trained
    # weights) are tried on these, at the task's own shapes; needs rerandomized_weights
    loaded_distributions: tuple[str, ...] = ()
    # the judge's thresholds beyond the limits above (kbverify.core.rules): one frozen record per protocol
    rules: Rules = DEFAULT_RULES
    # a guarded protocol's set run as a user's script calls the model (kbverify.core.inputs._as_user_set); off, a check
    # starts one interpreter fewer, and a kernel honest only while the harness watches it may pass (corpus:
    # exploits/relu_honest_only_while_the_collector_is_off)
    as_user_set: bool = True

    def with_overrides(self, **overrides) -> "Protocol":
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise InputError(f"protocol {self.name}: unknown field(s) {', '.join(sorted(unknown))}")
        for key in ("distributions", "rerandomized_distributions", "loaded_distributions"):
            if key in overrides:
                overrides[key] = tuple(overrides[key])
                bad = set(overrides[key]) - set(ALL_DISTRIBUTIONS)
                if bad:
                    raise InputError(f"protocol {self.name}: unknown distribution(s) {', '.join(sorted(bad))}")
        if "rules" in overrides and not isinstance(overrides["rules"], Rules):
            if not isinstance(overrides["rules"], dict):
                raise InputError(f"protocol {self.name}: rules must be an object of thresholds")
            overrides["rules"] = self.rules.with_overrides(overrides["rules"])
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def sha256(self) -> str:
        """The protocol's identity. Default rules and the as-a-user set left on are left out, so a protocol hashes
        as it did before either field existed and stored verdicts keep matching it; changing one changes the hash."""
        data = self.to_dict()
        if self.rules == DEFAULT_RULES:
            del data["rules"]
        if self.as_user_set:
            del data["as_user_set"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def protocol_from_dict(data: dict) -> Protocol:
    """A protocol from its `to_dict` (as a store or a worker's payload holds it)."""
    tuples = {key: tuple(data[key]) for key in ("distributions", "rerandomized_distributions",
                                                  "loaded_distributions") if key in data}
    return Protocol(**{**data, **tuples, "rules": Rules.from_dict(data.get("rules"))})


ORIGINAL = Protocol(
    name="original", rule="allclose", atol=1e-2, rtol=1e-2, norm_rtol=None, baseline_allowance=None,
    reference_tf32=False, reference_cudnn_tf32=True, trials=5, seeds="kernelbench", distributions=("x1",),
    hidden_shapes=False, shape_specialized_fails=False, rerandomized_weights=False, rerandomized_distributions=(),
    isolated=False, guards=False,
    train_mode=True, timing="kernelbench", warmup_calls=3, device_warmup_s=0.0, timing_trials=100,
    baseline_matmul_tf32=False,
    baseline_cudnn_tf32=True, candidate_grad_enabled=True, timing_budget_s=0.0, ci_half_width=0.0,
    samples="first", exclude_degenerate=False,
)

# KernelBench-Verified: its four distributions must all pass at 1e-3 (reference under PyTorch's default flags),
# the candidate in a process of its own, timed KernelBench's way (3 warm-ups, 10 trials, mean) against a TF32-matmul
# eager baseline; no guards, no hidden shapes, default weights only.
KBV = dataclasses.replace(
    ORIGINAL, name="kbv", atol=1e-3, rtol=1e-3, trials=1, seeds="kernelbench", isolated=True,
    distributions=("x1", "x3", "x0.01", "neg"), timing_trials=10, baseline_matmul_tf32=True, samples="best",
    candidate_grad_enabled=False, exclude_degenerate=True,
)

VERIFIED = Protocol(
    name="verified", rule="verified", atol=1e-3, rtol=1e-3, norm_rtol=1e-3, baseline_allowance=4.0,
    reference_tf32=False, reference_cudnn_tf32=False, trials=1, seeds="secret", distributions=ALL_DISTRIBUTIONS,
    hidden_shapes=True, shape_specialized_fails=True, rerandomized_weights=True,
    rerandomized_distributions=("x1", "neg", "shifted"), loaded_distributions=("x1", "mixed_sign"),
    isolated=True, guards=True,
    train_mode=True, timing="interleaved", warmup_calls=3, device_warmup_s=0.2, timing_trials=200,
    baseline_matmul_tf32=True,
    baseline_cudnn_tf32=True, candidate_grad_enabled=False, timing_budget_s=2.0, ci_half_width=0.005,
    samples="first", exclude_degenerate=True,
)

PRESETS = {p.name: p for p in (ORIGINAL, KBV, VERIFIED)}


def get_protocol(spec: str) -> Protocol:
    """A preset name or the path of a protocol JSON file."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"unknown protocol {spec!r}: use one of {', '.join(PRESETS)} or a protocol file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise InputError(f"{path}: not a protocol file: {error}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a protocol file holds a JSON object")
    base_name = data.pop("base", "verified")
    if not isinstance(base_name, str) or base_name not in PRESETS:
        raise InputError(f"{path}: unknown base protocol {base_name!r}: use one of {', '.join(PRESETS)}")
    data.setdefault("name", path.stem)
    base = PRESETS[base_name]
    try:
        return base.with_overrides(**{key: _checked_field(key, value, base) for key, value in data.items()})
    except InputError as error:
        raise InputError(f"{path}: {error}") from None


# What a protocol file may set each field to, beyond its type (a field not listed keeps its preset's type; a test
# sets every field to its preset value through a file, so a new field cannot be left unloadable).
_CHOICES = {"rule": ("allclose", "verified"), "seeds": ("kernelbench", "secret"),
            "timing": ("kernelbench", "interleaved"), "samples": ("first", "best")}
_NON_NEGATIVE = ("atol", "rtol", "norm_rtol", "baseline_allowance", "device_warmup_s", "timing_budget_s",
                 "ci_half_width", "warmup_calls")
_AT_LEAST_ONE = ("trials", "timing_trials")
_OPTIONAL = ("norm_rtol", "baseline_allowance")


def _checked_field(key: str, value, base: Protocol):
    """`value` for field `key` if it has the field's type and range; InputError naming the field otherwise."""
    fields = {f.name: f for f in dataclasses.fields(Protocol)}
    if key not in fields:
        raise InputError(f"unknown field {key!r} (a protocol file sets fields of Protocol)")
    current = getattr(base, key)
    if value is None and key in _OPTIONAL:
        return None
    if key in ("distributions", "rerandomized_distributions", "loaded_distributions"):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise InputError(f"{key} must be a list of distribution names ({', '.join(ALL_DISTRIBUTIONS)})")
        if key == "distributions" and not value:
            raise InputError("distributions must name at least one distribution")
        return value
    if key == "rules":
        if not isinstance(value, dict):
            raise InputError("rules must be an object of thresholds (kbverify.core.rules.Rules)")
        return value
    if key == "name":
        if not isinstance(value, str) or not value.strip() or "," in value:
            raise InputError(f"name must be a non-empty string without commas, got {value!r}")
        return value
    if isinstance(current, bool) or key in _CHOICES:
        expected = _CHOICES.get(key, (True, False))
        if value not in expected or type(value) is not type(expected[0]):
            raise InputError(f"{key} must be one of {', '.join(map(json.dumps, expected))}, got {json.dumps(value)}")
        return value
    return _checked_number(key, value, integer=isinstance(current, int))


def _checked_number(key: str, value, *, integer: bool):
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise InputError(f"{key} must be {'an integer' if integer else 'a number'}, got {json.dumps(value)}")
    if not math.isfinite(value):
        raise InputError(f"{key} must be finite, got {value}")
    low = 1 if key in _AT_LEAST_ONE else 0
    if key in _AT_LEAST_ONE + _NON_NEGATIVE and value < low:
        raise InputError(f"{key} must be at least {low}, got {value}")
    return value if integer else float(value)


def parse_protocols(specs: str) -> list[Protocol]:
    """`original,verified` → both, in the order given, without duplicates. Two protocols of one name would write
    their verdicts over each other's, so they are refused."""
    names = [s.strip() for s in specs.split(",") if s.strip()]
    if not names:
        raise InputError("no protocol given")
    protocols = [get_protocol(name) for name in dict.fromkeys(names)]
    seen: dict[str, str] = {}
    for spec, protocol in zip(dict.fromkeys(names), protocols):
        if protocol.name in seen:
            raise InputError(f"--protocol: {seen[protocol.name]} and {spec} are both named {protocol.name!r}; give "
                             f"the protocol file another \"name\"")
        seen[protocol.name] = spec
    for protocol in protocols:
        if protocol.seeds == "kernelbench" and protocol.trials > len(KERNELBENCH_TRIAL_SEEDS):
            raise InputError(f"protocol {protocol.name}: seeds \"kernelbench\" has {len(KERNELBENCH_TRIAL_SEEDS)} "
                             f"trial seeds, trials is {protocol.trials}")
    return protocols
