"""Children that did not report, and timing that ended before its rounds were judged: whose failure each is.
Pure: the runner runs the probes these rules ask about (a worker that starts here, the reference alone)."""

from __future__ import annotations

from kbverify.core.errors import InfrastructureError
from kbverify.core.evidence import Evidence, Origin
from kbverify.core.protocols import Protocol
from kbverify.core.status import Status
from kbverify.judge.sets import expect_origin
from kbverify.judge.timing import refusal


def died_starting_up(outcome) -> bool:
    """A child (a kbverify.harness.sandbox.ChildOutcome) that died with no phase recorded and not for a timeout: ours
    unless a worker starts on this machine, which only a probe worker can tell (the runner's to run)."""
    return not outcome.build_dir_over and not outcome.last_phase and not outcome.timed_out


def death(outcome, party: str) -> tuple[Status, str]:
    """A child that did not report: blame the candidate only if it was running candidate code. Where it died
    starting up (`died_starting_up`), the caller has seen a probe worker start and finish here.

    The phases are the child's own messages, so once submission code has run (a candidate phase was announced)
    the ones after it are the submission's to choose: from then on the death is the candidate's whatever phase
    it last named. Before that the phase record is ours and names the party."""
    if outcome.build_dir_over:  # the parent's own measure of what the job left on the host's disk
        return Status.RUNTIME_ERROR, f"its build folder outgrew its bound and was emptied: {outcome.build_dir_over}"
    tainted = outcome.ran_submission and outcome.submission_phase_seen
    where = (outcome.last_phase if not tainted or outcome.last_phase.startswith("candidate")
             else f"{outcome.last_phase} (announced after submission code ran)") or "start-up"
    if died_starting_up(outcome):
        where = "a phase it left unrecorded (a probe worker started and finished here)"
        tainted = tainted or outcome.ran_submission
    blamed = tainted or _candidate_phase(outcome.trusted_phase or outcome.last_phase, party)
    if outcome.timed_out:
        # the reference's own phases are never the candidate's fault, even in the candidate's worker
        status = Status.TIMEOUT if blamed else Status.UNVERIFIABLE
        if outcome.stalled_s is not None:
            return status, (f"no progress for {outcome.stalled_s:.0f} s during {where} (hang budget "
                            f"{outcome.stall_allowance_s:.0f} s), ended after {outcome.wall_s:.0f} s")
        return status, f"timed out during {where} after {outcome.wall_s:.0f} s"
    how = f"signal {outcome.signal}" if outcome.signal else f"exit code {outcome.exit_code}"
    detail = f"{party} process died during {where} ({how})"
    tail = (outcome.output_tail or outcome.output_head).strip().splitlines()[-3:]
    if tail:
        detail += ": " + " | ".join(tail)[-400:]
    return (Status.CRASHED if blamed else Status.UNVERIFIABLE), detail


def reference_death(outcome) -> tuple[Status, str]:
    """The judge's own worker (the reference, no submission code) did not report: never the kernel's failure."""
    _, detail = death(outcome, "reference")
    return Status.UNVERIFIABLE, "reference/judge failed: " + detail


def untimed_reference() -> tuple[Status, str]:
    """The reference's timing worker (no submission code) gave no time: nothing to compare the kernel with."""
    return Status.UNVERIFIABLE, "the reference could not be timed"


def unloadable_entry(reason: str) -> tuple[Status, str]:
    """A published entry that could not be turned into a unit (its task or its code missing): its claim stands
    unverified."""
    return Status.UNVERIFIABLE, reason


def _candidate_phase(phase: str, party: str) -> bool:
    return phase.startswith("candidate") or (party == "candidate" and not phase.startswith("reference"))


# ---- the timed run's record -------------------------------------------------------------------------------------

def timed_failure(claimed: Evidence, protocol: Protocol, *, forged: str, stopped: str, failed_side: str = "",
                  exit_code, reference: Evidence) -> tuple[Status, str] | None:
    """What ends an isolated protocol's timing before its rounds are judged (`decide_timing`), or None.
    `claimed`: the candidate's timing worker's record; `forged`, `stopped`: what the parent found of the replies
    of the worker of `failed_side` (kbverify.timing.timing_control); `reference`: the record of the worker that timed the
    reference beside it, computed (it never ran submission code)."""
    record = claimed.plain()
    if forged and failed_side != "ref":
        return Status.EXPLOIT_TAMPER, "the timing worker's replies are not what it measured: " + forged
    if claimed.malformed:
        return Status.EXPLOIT_TAMPER, "the timing worker's record is not one the harness writes: " + claimed.malformed
    if protocol.guards and record.get("refused"):  # before the errors a refusal usually causes
        return Status.EXPLOIT_TAMPER, refusal(record)
    if protocol.guards and str(record.get("error", "")).startswith("HarnessChanged"):
        return Status.EXPLOIT_TAMPER, "while timed: " + record["error"]
    expect_origin(reference, Origin.COMPUTED)
    if reference.malformed:
        raise InfrastructureError(f"{reference.source}'s record is not one the harness writes: {reference.malformed}")
    said = reference.plain()
    if failed_side == "ref" or said.get("error") or said.get("load_error"):
        # nothing of the candidate's ran there: the reference could not be timed, never the kernel's fault
        why = (forged or stopped) if failed_side == "ref" else str(said.get("error") or said.get("load_error"))
        return Status.UNVERIFIABLE, "the reference could not be timed: " + why[:300]
    if record.get("load_error") or record.get("error"):
        # the reference timed alone did not fail (above): whatever failed beside the candidate is the candidate's
        return Status.RUNTIME_ERROR, "while timed: " + (record.get("load_error") or record.get("error"))
    if stopped:
        # The rounds are the parent's to end: a worker that stopped answering and then exited, whatever result it
        # sent, ended its own timing (a record of its choosing would follow).
        return Status.CRASHED, (f"while timed: {stopped}; the worker then exited (exit code {exit_code}) before "
                                f"its rounds were done")
    return None
