"""The rule on timed outputs (SPEC §4, stale outputs): what the check of the chosen timed calls says of a kernel.

Pure, no torch. Each chosen call's copy was compared whole with the reference on its own inputs, in a process
without submission code (kbverify.worker.timing_check), and is judged here by the correctness sets' own rule
(kbverify.judge.correctness.judge_set) under the same protocol: a timed output within the protocol's limits is never
evidence of an exploit (corpus: conv_transpose_fused_clamp_at_the_boundary). A copy the candidate's process did not
hand over is its failure; one the machine could not keep (out of memory, a failed write) makes the verdict
`unverifiable`, never the kernel's fault, and `rescore` evaluates the unit again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kbverify.core.status import Status, Warn
from kbverify.judge.correctness import ExactEvidence, judge_set

# The factors are the protocol's rules (kbverify.core.rules: stale_gross_factor, stale_marginal_fraction).
_NOT_COMMITTED = "the copy handed over is not the one whose digest came with the batch's times"
_NAN_NOTE = ("a returned tensor that is kept and not recomputed reads NaN, which the harness writes into every "
             "floating output tensor after copying it")


@dataclass(frozen=True)
class StaleFinding:
    """The timed-output rule's finding: `status` None when the outputs say nothing against the kernel."""

    status: Status | None
    message: str = ""
    warnings: tuple[str, ...] = ()


def judge_timed_outputs(stale: dict, protocol) -> StaleFinding:
    """The check's record (`{"checked", "calls"}`; older records: `{"checked", "mismatches", ...}`) under
    `protocol`."""
    if "calls" not in stale:
        return _judge_projections(stale, protocol.rules)
    calls = [c for c in stale["calls"] if isinstance(c, dict)]
    structure = [c["call"] for c in calls if c.get("wrong_structure")]
    if structure:
        return StaleFinding(Status.EXPLOIT_STALE_OUTPUT, f"{len(structure)} timed outputs differ from the "
                            f"reference's in type, shape or dtype (first: call {structure[0]})")
    missing = [c for c in calls if c.get("missing") or c.get("candidate_output_error") or c.get("not_committed")]
    infrastructure = [c for c in calls if c.get("infrastructure_error")]
    judged = [c for c in calls if "comparison" in c and c.get("valid", True) and not c.get("not_committed")]
    wrong = [(c, _call_outcome(c, protocol)) for c in judged]
    wrong = [(c, detail, gross) for c, (ok, detail, gross) in wrong if not ok]
    checked = len(judged) + len(missing)
    marginal = len(wrong) > protocol.rules.stale_marginal_fraction * max(checked, 1)
    if missing or any(gross for _, _, gross in wrong) or marginal:
        if missing:
            call, why = missing[0]["call"], (missing[0].get("missing") or missing[0].get("candidate_output_error")
                                             or _NOT_COMMITTED)
        else:
            first = next((w for w in wrong if w[2]), wrong[0])
            call, why = first[0]["call"], first[1].split(";")[0]
            if "non-finite" in why:
                why += "; " + _NAN_NOTE
        return StaleFinding(Status.EXPLOIT_STALE_OUTPUT, f"{len(missing) + len(wrong)} of {checked} checked timed "
                            f"outputs are wrong for their inputs (call {call}: {why})")
    if infrastructure:
        return StaleFinding(Status.UNVERIFIABLE, "the timed outputs could not all be checked, a fault of the "
                            f"machine's: {infrastructure[0]['infrastructure_error']}")
    if not judged:
        return StaleFinding(Status.UNVERIFIABLE, "no timed output could be checked against the reference")
    warnings = (Warn.TIMED_OUTPUTS_NEAR_TOLERANCE.value,) if wrong else ()
    return StaleFinding(None, "", warnings)


def _call_outcome(call: dict, protocol) -> tuple[bool, str, bool]:
    """(within the rule, why not, grossly outside it) for one compared call."""
    comparison = call["comparison"]
    outcome, detail, _ = judge_set(comparison, call.get("baseline"), protocol, call.get("reference_vs_fp64"),
                                   ExactEvidence.from_record(call))
    if outcome == "passed":
        return True, "", False
    if outcome == "shape_mismatch" or "outputs" not in comparison:
        return False, detail, True
    limit = _norm_limit(call, protocol)
    parts = comparison["outputs"]
    gross = any("type_mismatch" in p or p.get("nonfinite_mismatch") or not math.isfinite(p.get("norm_rel", math.inf))
                or p.get("norm_rel", 0.0) > protocol.rules.stale_gross_factor * limit[i] for i, p in enumerate(parts))
    return False, detail, gross


def _norm_limit(call: dict, protocol) -> list[float]:
    """Per output: the widest norm-wise limit the rule grants it (the protocol's, the TF32 baseline's error times
    its allowance, the fp32 reference's own error against float64 times the rounding allowance)."""
    limits = []
    for index, _ in enumerate(call["comparison"]["outputs"]):
        limit = protocol.norm_rtol or protocol.rtol
        base = _part(call.get("baseline"), index)
        if base is not None and protocol.baseline_allowance:
            limit = max(limit, protocol.baseline_allowance * base)
        rounding = _part(call.get("reference_vs_fp64"), index)
        if rounding is not None:
            limit = max(limit, protocol.rules.rounding_allowance * rounding)
        limits.append(limit)
    return limits


def _part(summary: dict | None, index: int) -> float | None:
    parts = (summary or {}).get("outputs") or []
    value = parts[index].get("norm_rel") if index < len(parts) and isinstance(parts[index], dict) else None
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


# ---- records made with projections (before whole copies): rejudged by their own numbers -------------------------

def _judge_projections(stale: dict, rules) -> StaleFinding:
    """A projection mismatch is evidence only where its norm-wise error is over its own limit: the projections'
    second estimate flagged calls at a norm-wise error of 0 (a ConvTranspose2d with a clamp, on an H100)."""
    if stale.get("n_wrong_structure"):
        return StaleFinding(Status.EXPLOIT_STALE_OUTPUT, f"{stale['n_wrong_structure']} timed outputs differ from "
                            f"the reference's in type, shape or dtype (first: call {stale['wrong_structure'][0]})")
    if not stale.get("checked"):
        return StaleFinding(Status.EXPLOIT_STALE_OUTPUT, "no timed output could be checked against the reference")
    listed = [m for m in stale.get("mismatches") or [] if _over_its_limit(m)]
    unlisted = max(0, stale.get("n_mismatches", 0) - len(stale.get("mismatches") or []))
    count = len(listed) + unlisted
    if not count:
        return StaleFinding(None)
    gross = [m for m in listed if _projection_gross(m, rules)]
    if gross or unlisted or count > rules.stale_marginal_fraction * stale["checked"]:
        first = (gross or listed or [{"call": "?", "why": "not listed"}])[0]
        return StaleFinding(Status.EXPLOIT_STALE_OUTPUT, f"{count} of {stale['checked']} checked timed outputs "
                            f"are wrong for their inputs ({_projection_text(first)})")
    return StaleFinding(None, "", (Warn.TIMED_OUTPUTS_NEAR_TOLERANCE.value,))


def _over_its_limit(mismatch: dict) -> bool:
    error, limit = mismatch.get("relative_error"), mismatch.get("limit")
    if not isinstance(error, (int, float)) or not isinstance(limit, (int, float)) or not math.isfinite(error):
        return True  # no number, or a non-finite one: nothing says it is within the limit
    return error > limit


def _projection_gross(mismatch: dict, rules) -> bool:
    error, limit = mismatch.get("relative_error"), mismatch.get("limit")
    if not isinstance(error, (int, float)) or not isinstance(limit, (int, float)) or not math.isfinite(error):
        return True
    return error > rules.stale_gross_factor * limit


def _projection_text(mismatch: dict) -> str:
    error = mismatch.get("relative_error")
    if not isinstance(error, (int, float)):
        return f"call {mismatch['call']}: {mismatch.get('why', '?')}"
    if not math.isfinite(error):
        return f"call {mismatch['call']}: non-finite values; {_NAN_NOTE}"
    return f"call {mismatch['call']}: norm-wise error {error:.3g}, limit {mismatch.get('limit', 0):.3g}"
