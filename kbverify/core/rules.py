"""The judge's thresholds, gathered in one frozen record per protocol (`Protocol.rules`). Pure: no torch.

Every number the judge compares evidence with, beyond the protocol's own limits (atol, rtol, norm_rtol,
baseline_allowance), lives here and nowhere else, with the reason and the corpus case that pins it. A protocol
file may override any of them (`"rules": {"excessive_speedup": 20}`); the protocol's hash then changes with them.
docs/verdicts.md lists them with the step of the path each one decides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kbverify.core.errors import InputError

RULES_VERSION = 1


@dataclass(frozen=True)
class Rules:
    version: int = RULES_VERSION
    # ---- correctness allowances (kbverify.judge.allowances) -------------------------------------------------------
    # A float64 rerun further off than this norm-wise computed something else (other dropout draws, say), so its
    # distance is no measure of rounding.
    precision_error_cap: float = 1e-2
    # The fp32 reference's own error against float64 measures how lucky one summation order was, not a precision:
    # an fp32 kernel summing in another order lands several times further off, while bf16 or fp16 lands thousands
    # of times further (corpus gemm_relu_bias_unordered_splitk; honest im2col on the wide-range set: 6.6x).
    rounding_allowance: float = 16.0
    # That allowance covers a tail only: the share of elements over the plain limit may exceed the reference's by
    # the same factor and by this floor at most (granted to every element, it let 8% of outputs move by 1.3%).
    rounding_tail_floor: float = 1e-4
    # ---- the timed outputs' check (kbverify.judge.timed_outputs) -------------------------------------------
    # One checked call this many times over its norm-wise limit, or non-finite where the reference is finite, is
    # a wrong output; a smaller excess is one only on more than `stale_marginal_fraction` of the checked calls
    # (a timed path that downgrades a few calls gains little). An error under the limit is never evidence
    # (corpus honest/conv_transpose_fused_clamp_at_the_boundary).
    stale_gross_factor: float = 3.0
    stale_marginal_fraction: float = 0.1
    # ---- the parent's accounting of the timing worker's replies (kbverify.timing.timing_control) --------------------
    # The parent's clock reads a little after the worker's last event: rounding, not time.
    reply_slack_ms: float = 0.05
    # The most a device-clock speedup may be inflated unseen: the unexplained time per call, against the
    # candidate's own claimed time (corpus matmul_divides_recorded_times).
    unexplained_fraction: float = 0.1
    unexplained_min_ms: float = 0.005
    # Below this many judged rounds, each round must account for its times (no order-statistic bound).
    few_rounds: int = 5
    # ---- the timing verdict (kbverify.judge.timing) ----------------------------------------------------------
    # A warning only: speedups past this are rare enough to deserve a second look.
    excessive_speedup: float = 10.0
    # Below this share of the time needed to read the inputs once at peak bandwidth: impossible.
    impossible_margin: float = 0.5
    # Beyond this slowdown of the reference beside the candidate, its time comes from the clean reference. On a
    # CPU two processes' copies of one reference differ more (an honest README example read 1.16x on 2 cores).
    reference_slowdown_tolerance: float = 1.1
    cpu_reference_slowdown_tolerance: float = 1.5
    # Work left running after the end event (GPU corpus matmul_side_stream_no_wait).
    unsync_gap_fraction: float = 0.2
    unsync_gap_min_ms: float = 0.02
    # Launch overhead inside the device clock: host time uncovered on this share of calls, past this jitter.
    host_timed_fraction: float = 0.1
    host_jitter_ms: float = 0.05
    # The speed class's margin where no A/A ran.
    default_noise_margin: float = 0.01

    def slowdown_tolerance(self, on_gpu: bool) -> float:
        return self.reference_slowdown_tolerance if on_gpu else self.cpu_reference_slowdown_tolerance

    def with_overrides(self, overrides: dict) -> "Rules":
        fields = {f.name: f for f in dataclasses.fields(self) if f.name != "version"}
        if overrides.get("version", self.version) != self.version:
            raise InputError(f"rules: version {overrides['version']!r} is not this kbverify's ({self.version})")
        overrides = {key: value for key, value in overrides.items() if key != "version"}
        unknown = set(overrides) - set(fields)
        if unknown:
            raise InputError(f"rules: unknown field(s) {', '.join(sorted(unknown))}")
        checked = {}
        for key, value in overrides.items():
            integer = fields[key].type == "int"
            if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or value < 0:
                kind = "a non-negative integer" if integer else "a non-negative number"
                raise InputError(f"rules: {key} must be {kind}, not {value!r}")
            checked[key] = int(value) if integer else float(value)
        return dataclasses.replace(self, **checked)

    @classmethod
    def from_dict(cls, data: dict | None) -> "Rules":
        """The rules a stored protocol was judged under; a store from before the rules record has the defaults."""
        if not data:
            return DEFAULT_RULES
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


DEFAULT_RULES = Rules()
