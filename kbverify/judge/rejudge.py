"""Recompute a stored verdict under another protocol's rules from its raw evidence alone (no GPU, no code run).

Only what was measured can be rejudged: sets the new protocol does not ask for are dropped, sets it asks for that
were never run make the verdict `unverifiable` rather than silently passing.
"""

from __future__ import annotations

import dataclasses

from kbverify.core.protocols import Protocol
from kbverify.core.records import SetResult, Verdict
from kbverify.core.status import Status, Warn
from kbverify.judge.sets import SET_WARNINGS, decide_set, decide_sets
from kbverify.judge.timing import decide_timing

_VERDICT_LEVEL = {Status.COMPILE_ERROR, Status.EXPLOIT_TAMPER, Status.CRASHED, Status.TIMEOUT}
# Decided by the timing guards alone, from the raw timing record: decided again from it.
_TIMING_LEVEL = {Status.EXPLOIT_STALE_OUTPUT, Status.EXPLOIT_UNSYNCHRONIZED, Status.EXPLOIT_IMPOSSIBLE_SPEED,
                 Status.EXPLOIT_BASELINE_TAMPER}


def _wanted(result: SetResult, protocol: Protocol) -> bool:
    if result.distribution not in protocol.distributions:
        return False
    if result.shape != "original" and not protocol.hidden_shapes:
        return False
    if result.weights == "loaded":
        return protocol.rerandomized_weights and result.distribution in protocol.loaded_distributions
    return result.weights == "default" or (protocol.rerandomized_weights
                                           and result.distribution in protocol.rerandomized_distributions)


def _rejudge_set(result: SetResult, protocol: Protocol) -> SetResult:
    if not result.guards:
        # The candidate's record has no entry for the set: what check made of that came from the candidate's
        # whole record (sets.unrun_set), which a verdict does not keep and no protocol's rules change.
        return result
    status, detail = decide_set(result.guards, {"valid": result.valid, **result.errors}, protocol, {})
    return dataclasses.replace(result, status=status, detail=detail)


def _timing_evidence_current(timing: dict) -> bool:
    """The stored timing record holds what today's guards decide from. Older GPU records (an idle gap that
    counted the harness's own projection, `gaps_ms`) do not: their timing verdicts stand as they were."""
    record = timing.get("interleaved") or {}
    if not record:
        return False
    on_gpu = str(timing.get("device", "cpu")).startswith("cuda")
    return not on_gpu or "settle_gaps_ms" in record


def rejudge_verdict(verdict: Verdict, protocol: Protocol) -> Verdict | None:
    if not verdict.sets:
        return None
    if not protocol.isolated:
        return None
    kept = [s for s in verdict.sets if _wanted(s, protocol)]
    missing = set(protocol.distributions) - {s.distribution for s in verdict.sets}
    base = dataclasses.replace(verdict, protocol=protocol.name, protocol_sha256=protocol.sha256)
    decided_by_sets = any(s.status is not Status.PASSED for s in verdict.sets)
    decided_by_timing = (verdict.status in _TIMING_LEVEL and protocol.guards
                         and _timing_evidence_current(verdict.timing))
    if verdict.status in _VERDICT_LEVEL or (verdict.status is not Status.PASSED and not decided_by_sets
                                            and not decided_by_timing):
        # decided outside the input sets (build, tamper, a crash, the timing guards): no stored set evidence
        # can overturn it
        return base
    if missing and decided_by_timing and not decided_by_sets:
        return base  # a failure found while timed stays one; the missing sets cannot clear it
    if missing:
        return dataclasses.replace(base, status=Status.UNVERIFIABLE,
                                   message=f"never measured: distributions {sorted(missing)}")
    rejudged = [_rejudge_set(result, protocol) for result in kept]
    # the same end as check's (kbverify.judge.sets.decide_sets); whether the static scan saw half precision is not
    # stored, only whether an earlier verdict's fp16 warning said so
    decided = decide_sets(rejudged, protocol, fp16_suspect=Warn.FP16_PATH.value in verdict.warnings)
    warnings = [w for w in verdict.warnings if w not in SET_WARNINGS] + list(decided.warnings)
    new = dataclasses.replace(base, status=decided.status, message=decided.message, sets=tuple(rejudged),
                              warnings=tuple(dict.fromkeys(warnings)), speedup=None, speedup_ci=None,
                              speed_class=None)
    if decided.status is Status.PASSED and verdict.timing.get("interleaved"):
        new = decide_timing(new, protocol)
    return new
