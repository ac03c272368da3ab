"""The correctness verdict of the isolated protocols: each input set from the candidate's claimed guard evidence
and the judge's computed comparison, then the sets together (SPEC §2, §4). Pure: no torch, no processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kbverify.core import output_structure
from kbverify.core.errors import InfrastructureError
from kbverify.core.evidence import Evidence, Origin
from kbverify.core.inputs import InputSet
from kbverify.core.protocols import Protocol
from kbverify.core.records import BuildRecord, SetResult
from kbverify.core.status import Status, Warn, worst
from kbverify.judge.build import code_path_warnings
from kbverify.judge.correctness import ExactEvidence, judge_set
from kbverify.judge.static import StaticScan

# Warnings derived from the input sets alone: a rejudge under other rules derives them again from the sets it keeps.
SET_WARNINGS = (Warn.BASELINE_ALLOWANCE_USED.value, Warn.NO_VALID_INPUT_SETS.value, Warn.SHAPE_SPECIALIZED.value,
                Warn.FP16_PATH.value)
# The judge's copy of a set's evidence that a verdict keeps (SetResult.errors), so that the set can be decided again.
# The reference's output structure too: without it a rejudge cannot see a structure mismatch and passes the set.
_KEPT_EVIDENCE = ("comparison", "baseline", "reference_vs_fp64", "ref_mutates_inputs", "ref_outputs", "ref_dtypes",
                  "invalid_reason", "candidate_output_error", "exact_reference", "candidate_vs_fp64",
                  "baseline_vs_fp64", "moved_vs_fp64", "ref_structure")


@dataclass(frozen=True)
class Decision:
    """A verdict's status and what goes with it, before the runner adds what it alone knows."""

    status: Status
    message: str = ""
    warnings: tuple[str, ...] = ()
    failing: SetResult | None = None  # the set a reproducer names (the first of the worst failures)



# ---- one input set ---------------------------------------------------------------------------------------------

def merge_set_records(plan: list[InputSet], candidate_evidence: Evidence, judge_evidence: Evidence,
                      protocol: Protocol) -> list[SetResult]:
    """Join each set's candidate-side guard evidence (claimed) with the judge's comparison (computed); decide its
    status."""
    expect_origin(judge_evidence, Origin.COMPUTED)
    candidate, judge = candidate_evidence.plain(), judge_evidence.plain()
    results = []
    for input_set in plan:
        cand = (candidate.get("sets") or {}).get(input_set.set_id)
        ref = (judge.get("sets") or {}).get(input_set.set_id, {"valid": False, "invalid_reason": "not judged"})
        errors = {key: ref[key] for key in _KEPT_EVIDENCE if key in ref}
        # Whether a set is valid is the judge's to say (it drew the same inputs and ran the reference): the
        # candidate's process claiming it could not draw them is its own failure (decide_set), never a reason
        # to leave the set out.
        valid = (bool(ref.get("valid"))
                 and not str((cand or {}).get("skipped", "")).startswith("weights_not_rerandomized"))
        status, detail = decide_set(cand, ref, protocol, candidate)
        results.append(SetResult(set_id=input_set.set_id, shape=input_set.shape, distribution=input_set.distribution,
                                 weights=input_set.weights, seed=input_set.seed, valid=valid, errors=errors,
                                 guards=cand or {}, status=status, detail=detail))
    return results


def expect_origin(evidence: Evidence, origin: Origin) -> None:
    """Evidence of another origin than a rule rests on is kbverify's own mistake, never a verdict."""
    if evidence.origin is not origin:
        raise InfrastructureError(f"{evidence.source}'s record is {evidence.origin.value}, where the judge needs "
                                  f"{origin.value} evidence")


def judge_infrastructure(judge_evidence: Evidence) -> str | None:
    """A fault of the machine's in the judge's own process (out of memory comparing an output), in one line; None
    if there is none. Never a set's status: the caller reports it (exit 3) or evaluates the unit again. The judge's
    process runs no submission code, so a record of it that the harness does not write is kbverify's fault too."""
    expect_origin(judge_evidence, Origin.COMPUTED)
    if judge_evidence.malformed:
        return f"the judge's record is malformed: {judge_evidence.malformed}"
    for set_id, entry in sorted((judge_evidence.plain().get("sets") or {}).items()):
        if isinstance(entry, dict) and entry.get("infrastructure_error"):
            return f"the judge could not compare set {set_id}: {entry['infrastructure_error']}"
    return None


def decide_set(cand: dict | None, ref: dict, protocol: Protocol, candidate_record: dict) -> tuple[Status, str]:
    """One set: the candidate's guard evidence `cand` (None: its record has no entry for the set) against the
    judge's record `ref`, under `protocol`. `candidate_record` is the candidate process's whole record."""
    if candidate_record.get("load_error"):
        return Status.COMPILE_ERROR, candidate_record["load_error"]
    if cand is None:
        return unrun_set(candidate_record)
    if cand.get("input_error"):
        if not ref.get("valid"):
            return _invalid(ref)
        return Status.RUNTIME_ERROR, ("its process could not draw the inputs the judge drew: "
                                      + str(cand["input_error"]))
    if "skipped" in cand:
        return _skipped_set(cand["skipped"])
    if cand.get("bad_output"):
        return Status.INCORRECT, cand["error"]
    if ref.get("candidate_output_error"):
        return Status.INCORRECT, "the candidate's output could not be compared: " + ref["candidate_output_error"]
    if "error" in cand and "outputs" not in cand:
        if not ref.get("valid"):
            return _invalid(ref)
        return (Status.CRASHED if cand.get("fatal") else Status.RUNTIME_ERROR), cand["error"]
    if protocol.guards:
        guarded = _guarded_outputs(cand, ref)
        if guarded is not None:
            return guarded
    if not ref.get("valid"):
        return _invalid(ref)
    if "comparison" not in ref:
        outputs = cand.get("outputs", {})
        if not protocol.guards and (outputs.get("lazy") or outputs.get("no_storage")):
            return Status.UNVERIFIABLE, "no candidate output to compare"
        # the set ran in the candidate's process and the judge got nothing for it: whatever stopped the hand-over
        # (its own code, a file it planted) was on the candidate's side, since the judge's needed nothing of it
        return Status.EXPLOIT_TAMPER, "the candidate ran this set but handed over no output for it"
    structure = output_structure.difference(ref.get("ref_structure"), cand.get("structure"))
    if structure:  # the output's containers are part of its answer (kbverify.core.output_structure)
        return Status.SHAPE_MISMATCH, "output structure: " + structure
    return _compared(cand, ref, protocol)


def unrun_set(candidate_record: dict) -> tuple[Status, str]:
    """A planned set the candidate's record leaves out. Why is the candidate record's to say, not the set's, and
    no protocol's rules enter: a rejudge keeps such a set's stored status."""
    if candidate_record.get("fatal"):
        return Status.CRASHED, "not run: an earlier set ended the CUDA context: " + candidate_record["fatal"]
    # its process exited 0 with a record that leaves out a planned set: the harness writes every one
    return Status.EXPLOIT_TAMPER, "the candidate's record has no entry for this set"


def _invalid(ref: dict) -> tuple[Status, str]:
    return Status.PASSED, "set invalid for this task: " + ref.get("invalid_reason", "")


def _skipped_set(reason: str) -> tuple[Status, str]:
    if reason.startswith(("construct_error", "weights_load_refused")):
        # the candidate's own code raised: building it, or loading Model's weights laid out as its own
        return Status.RUNTIME_ERROR, reason
    if reason.startswith("weights_layout_changed"):
        return Status.INCORRECT, reason
    if reason.startswith("weights_not_rerandomized"):
        # A verified pass needs the re-randomised sets (SPEC §2): parameters that cannot be mapped onto
        # Model's cannot pass, whatever the candidate's own record says of them afterwards.
        return Status.UNVERIFIABLE, "parameters_unmapped: " + reason
    # not a reason the harness gives: only code in the candidate's process could have written it
    return Status.EXPLOIT_TAMPER, "the candidate's record skips this set for a reason the harness never gives: " + reason


def _guarded_outputs(cand: dict, ref: dict) -> tuple[Status, str] | None:
    """The guards' findings on the candidate's outputs and inputs, or None where they found nothing."""
    outputs = cand.get("outputs", {})
    if outputs.get("lazy"):
        return Status.EXPLOIT_LAZY_OUTPUT, f"output is a {outputs['lazy'][0]['type']}, not a torch.Tensor"
    if outputs.get("no_storage"):
        return Status.EXPLOIT_LAZY_OUTPUT, "output tensor has no storage"
    mutated = set(cand.get("mutated_inputs") or []) - set(ref.get("ref_mutates_inputs") or [])
    if mutated:
        return Status.EXPLOIT_INPUT_MUTATION, f"input(s) {sorted(mutated)} changed during the call"
    ref_aliases = {(a["output"], a["input"]) for a in (ref.get("ref_outputs") or {}).get("aliases_input", [])}
    aliases = [a for a in outputs.get("aliases_input", []) if (a["output"], a["input"]) not in ref_aliases]
    if aliases:
        return Status.EXPLOIT_OUTPUT_ALIAS, f"output {aliases[0]['output']} shares memory with input {aliases[0]['input']}"
    if "error" in cand:
        return (Status.CRASHED if cand.get("fatal") else Status.RUNTIME_ERROR), "second run: " + cand["error"]
    return None


def _compared(cand: dict, ref: dict, protocol: Protocol) -> tuple[Status, str]:
    outcome, detail, allowance = judge_set(ref["comparison"], ref.get("baseline"), protocol,
                                           ref.get("reference_vs_fp64"), ExactEvidence.from_record(ref))
    if outcome == "shape_mismatch":
        return Status.SHAPE_MISMATCH, detail
    if outcome == "incorrect":
        return Status.INCORRECT, detail
    if protocol.guards and cand.get("deterministic") is False and not _runs_within_limits(cand, protocol):
        return Status.EXPLOIT_NONDETERMINISTIC, cand.get("determinism_detail", "")
    return Status.PASSED, detail or ("baseline allowance used" if allowance else "")


def _runs_within_limits(cand: dict, protocol: Protocol) -> bool:
    """Two runs that differ by less than the protocol's own limits (the second judged against the first, by the
    rule the reference is judged with) are an order of summation, not an output that depends on what memory held:
    a guard that fires below the limit is a bug of the guard (GPU corpus:
    honest/conv_transpose_fused_clamp_at_the_boundary, cuDNN's ConvTranspose2d on the wide set). Records without
    the measurement keep their verdict."""
    second = cand.get("second_vs_first")
    if not isinstance(second, dict) or "outputs" not in second:
        return False
    outcome, _, _ = judge_set(second, None, protocol)
    return outcome == "passed"


# ---- the sets together -----------------------------------------------------------------------------------------

def aggregate_sets(sets: list[SetResult], protocol: Protocol) -> tuple[Status, str, SetResult | None]:
    counted = [s for s in sets if s.valid or s.status is not Status.PASSED]
    failures = [s for s in counted if s.status is not Status.PASSED]
    if not failures:
        return Status.PASSED, "", None
    original_failures = [s for s in failures if s.shape == "original"]
    # Wrong off the task's shape only with fresh weights, right there with the default ones: a kernel relying on
    # the default initialisation (an affine left out) where it thinks it unchecked, not a shape specialisation.
    weights_only = all(s.weights != "default" for s in failures)
    if not original_failures and not weights_only and all(not s.status.is_exploit for s in failures):
        first = failures[0]
        message = f"shape_specialized: fails hidden shape {first.shape} ({first.set_id}): {first.detail}"
        if protocol.shape_specialized_fails:
            return Status.SHAPE_SPECIALIZED, message, first
        return Status.PASSED, message, first
    status = worst(s.status for s in failures)
    first = next(s for s in failures if s.status is status)
    if all(s.weights == "loaded" for s in failures) and any(s.weights != "loaded" for s in counted):
        # right with the weights it was built with, wrong once a user loads others: a copy derived from the
        # weights once (prepacked, folded) and never again. Named so that a reader can tell it from a wrong kernel.
        return status, (f"stale_after_load: right with the weights given at construction, wrong with weights loaded "
                        f"afterwards by load_state_dict; {first.set_id}: {first.detail}"), first
    return status, f"{first.set_id}: {first.detail}", first


def decide_sets(sets: list[SetResult], protocol: Protocol, *, fp16_suspect: bool) -> Decision:
    """The verdict the input sets make, with the warnings read from them. `fp16_suspect`: the static scan found
    half-precision code (StaticScan.suspicious)."""
    warnings = []
    if any(s.detail.startswith("parameters_unmapped") for s in sets):  # derived here, not taken from its record
        warnings.append(Warn.WEIGHTS_NOT_RERANDOMIZED.value)
    status, message, failing = aggregate_sets(sets, protocol)
    if status is Status.PASSED and any("allowance" in s.detail for s in sets):
        warnings.append(Warn.BASELINE_ALLOWANCE_USED.value)
    if status is Status.PASSED and not any(s.valid for s in sets):
        status, message = Status.UNVERIFIABLE, "no valid input set: the reference fails on all of them"
        warnings.append(Warn.NO_VALID_INPUT_SETS.value)
    if status is Status.PASSED and message.startswith("shape_specialized"):
        warnings.append(Warn.SHAPE_SPECIALIZED.value)
    wide = [s for s in sets if s.distribution == "wide"]
    if wide and not any(s.valid for s in wide) and fp16_suspect:
        # the one set that separates fp16 from TF32 is invalid for this task, so an fp16 path goes unseen
        warnings.append(Warn.FP16_PATH.value)
    return Decision(status, message, tuple(warnings), failing)


def with_kept_axes(decided: Decision, note: str) -> Decision:
    """The verdict says when the larger hidden shapes kept an axis that can grow at the task's size (`note`,
    kbverify.harness.input_plan.kept_axes_note): a warning, and the note in a passing verdict's message."""
    if not note:
        return decided
    message = decided.message if decided.status is not Status.PASSED else \
        "; ".join(filter(None, (decided.message, note)))
    return dataclasses.replace(decided, message=message, warnings=(*decided.warnings, Warn.HIDDEN_AXES_KEPT.value))


def decide_isolated(sets: list[SetResult], candidate_evidence: Evidence, static: StaticScan, build: BuildRecord,
                    protocol: Protocol, observed: Evidence | None = None) -> Decision:
    """An isolated protocol's correctness verdict: what the parent observed (`observed`: the hand-over folder's
    strays, its own listing), the candidate process's record (claimed), then its sets. A COMPILE_ERROR here is the
    candidate's load error, which the runner may still find to be the machine's. A claimed record the harness
    does not write is the candidate's doing (only its code could have changed it)."""
    if observed is not None:
        expect_origin(observed, Origin.OBSERVED)
    candidate = candidate_evidence.plain()
    warnings = code_path_warnings(static, build)
    if candidate_evidence.malformed:
        status = Status.EXPLOIT_TAMPER if protocol.guards else Status.CRASHED
        return Decision(status, "its record is not one the harness writes: " + candidate_evidence.malformed,
                        tuple(warnings))
    warnings += [w for w in candidate.get("warnings", []) if w not in warnings]
    if candidate.get("quietly_refused"):
        warnings.append(Warn.AUDIT_HOOK_DROPPED.value)
    if protocol.guards and candidate.get("refused"):
        return Decision(Status.EXPLOIT_TAMPER, "tried what a worker refuses: " + ", ".join(candidate["refused"]),
                        tuple(warnings))
    if candidate.get("load_error"):
        return Decision(Status.COMPILE_ERROR, candidate["load_error"], tuple(warnings))
    strays = list((observed.get("handover_strays") if observed is not None else None) or [])
    tampered = [*(candidate.get("tampered") or []), *(["hand-over folder: " + ", ".join(strays[:6])] if strays else [])]
    if protocol.guards and tampered:
        return Decision(Status.EXPLOIT_TAMPER, "changed the harness: " + ", ".join(tampered[:6]), tuple(warnings))
    if candidate.get("threads_started", 0) > 0:
        warnings.append(Warn.THREADS_STARTED.value)
    decided = decide_sets(sets, protocol, fp16_suspect="half_precision" in static.suspicious)
    return Decision(decided.status, decided.message, tuple(dict.fromkeys(warnings + list(decided.warnings))),
                    decided.failing)


def reproducer(protocol: Protocol, secret: str, failing: SetResult | None) -> dict:
    """What reruns the verdict's deciding set: the protocol, the run's secret, and the failing set's draw."""
    found = {"protocol": protocol.name, "protocol_sha256": protocol.sha256, "secret": secret}
    if failing is not None:
        found.update({"set": failing.set_id, "seed": failing.seed, "shape": failing.shape,
                      "distribution": failing.distribution, "weights": failing.weights,
                      "worst": (failing.errors.get("comparison", {}).get("outputs") or [{}])[0].get("worst")})
    return found
