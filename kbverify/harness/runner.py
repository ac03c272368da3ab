"""One (task, submission, protocol) → one Verdict. The parent side: it plans, starts children, and turns their raw
records into statuses through the judge. It never imports a submission.

Deciding is separate from running: every status comes from `kbverify.judge`, which reads only evidence, so
`rejudge` reaches the same verdicts from a store without a GPU. What stays here is what needs a process to find
out (a probe worker, a probe build).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from kbverify import judge
from kbverify.core import evidence, stats
from kbverify.core.errors import InfrastructureError
from kbverify.core.inputs import derive_seed, new_run_secret
from kbverify.core.protocols import Protocol
from kbverify.core.records import BuildRecord, Verdict
from kbverify.core.status import Status
from kbverify.core.submissions import Submission
from kbverify.core.tasks import Task
from kbverify.harness import (device_share, gpu_processes, hang as hang_module, input_plan,
                              provenance as provenance_module, toolchain)
from kbverify.harness.channel import handover_strays, marker_names, write_marker
from kbverify.harness.sandbox import ChildOutcome, ChildSpec, run_child, run_children
from kbverify.harness.toolchain import build_env
from kbverify.judge.static import StaticScan, scan
from kbverify.judge.timing import decide_timing
from kbverify.timing import timing_control

log = logging.getLogger(__name__)

PROBE_WORKER_TIMEOUT_S = 120.0  # a fresh worker bringing up torch (and CUDA) on a busy machine


@dataclass(frozen=True)
class CheckOptions:
    device: str = "cpu"
    hidden_dirs: tuple[Path, ...] = ()
    only: str | None = None
    timeout_s: float = 300.0
    secret: str | None = None
    measure_speed: bool = True
    build_cache: Path | None = None
    keep_workdirs: bool = False
    hang_floor_s: float = hang_module.FLOOR_S  # a forward quiet for max(this, factor × reference call) is a timeout
    hang_factor: float = hang_module.FACTOR  # (kbverify.harness.hang; a floor of 0 leaves only --timeout)
    timing_mode: str = "auto"  # "auto": kbverify.timing.timing_modes decides; "hold" or "sync" ask for one (tests)
    max_jobs: int | None = None  # compiler processes per native build (MAX_JOBS); None: $MAX_JOBS, else every core
    # The device's lease when several units share it (kbverify.harness.device_share): correctness under the shared lease,
    # timing under the exclusive one. None: the check has its device to itself, as `check` on the command line.
    sharing: device_share.Sharing | None = field(default=None, compare=False, repr=False)


@dataclass
class _Context:
    task: Task
    submission: Submission
    protocol: Protocol
    options: CheckOptions
    static: StaticScan
    env: dict = field(default_factory=dict)
    worker_s: dict = field(default_factory=dict)  # job → its workers' wall seconds, summed over its runs
    isolation: dict = field(default_factory=dict)  # "isolated" / "degraded" → why, from every submission worker
    ran_submission: bool = False  # some child ran the submission's code (else isolation is "not_run")
    reference_call_s: float | None = None  # the judge's longest set of reference work (no submission code ran there)
    gpu_checks: list = field(default_factory=list)  # kbverify.harness.gpu_processes.check records around the timing

    def hang(self, pace=None):
        return hang_module.HangBudget(self.options.hang_floor_s, self.options.hang_factor, self.reference_call_s, pace)


def check(task: Task, submission: Submission, protocol: Protocol, options: CheckOptions, *,
          sample: int = 0, claimed_speedup: float | None = None, margin_cache=None) -> Verdict:
    started = time.monotonic()
    provenance_module.prefetch(options.device)
    context = _Context(task, submission, protocol, options, scan(submission.source), build_env(submission, options))
    if protocol.isolated:
        verdict = _check_isolated(context, margin_cache)
    else:
        with _phase(context, device_share.TIMING):  # its one job checks and times: timing, so alone
            verdict = _check_kernelbench(context)
    verdict = _with_gpu_checks(context, verdict)
    isolation, reason = judge.isolation(context.isolation, context.ran_submission)
    shared = {"device_share": options.sharing.provenance()} if options.sharing else {}
    return replace(
        verdict, sample=sample, claimed_speedup=claimed_speedup, elapsed_s=time.monotonic() - started,
        worker_s=dict(context.worker_s), isolation=isolation, isolation_reason=reason,
        provenance={**provenance_module.collect(options.device), "protocol_sha256": protocol.sha256, **shared})


def _phase(context: _Context, kind: str):
    """The device's lease of `kind` (kbverify.harness.device_share) around a phase, where the device is shared."""
    return device_share.phase(context.options.sharing, kind,
                              f"{context.task.name}/{context.submission.id}/{context.protocol.name}")


def _look_at_gpu(context: _Context, when: str) -> None:
    """Which compute processes hold the device, right before a timing worker starts or after the last ended. The
    run's own MPS server is not foreign: it is the daemon's child, not ours, and holds the device between clients."""
    sharing = context.options.sharing
    context.gpu_checks.append(gpu_processes.check(context.options.device, when,
                                                  ours_env=dict(sharing.correctness_env) if sharing else None))


def _with_gpu_checks(context: _Context, verdict: Verdict) -> Verdict:
    """A timed verdict carries what the looks at its device found, and is flagged where a foreign process held it
    (its speedup then does not count in fast_p: kbverify.results.counting.score_rows_from_verdicts) or where a GPU went
    unchecked."""
    if not verdict.timing or not context.gpu_checks:
        return verdict
    warnings = list(verdict.warnings) + gpu_processes.warnings_for(context.gpu_checks, context.options.device)
    return replace(verdict, timing={**verdict.timing, "gpu_processes": list(context.gpu_checks)},
                               warnings=tuple(dict.fromkeys(warnings)))


def _note_child(context: _Context, job: str, outcome: ChildOutcome) -> None:
    """Book-keeping for every child: its wall time, how it was confined, and what it claims of the machine."""
    log.info("%s child for %s: %.2f s (%s)", job, context.submission.id, outcome.wall_s, outcome.timeline())
    _count_worker(context, job, outcome.wall_s)
    if outcome.sandbox_failed:
        raise InfrastructureError(f"the {job} worker's sandbox could not start: {outcome.sandbox_failed}")
    context.ran_submission |= outcome.ran_submission
    if outcome.ran_submission and outcome.isolation in ("isolated", "degraded"):
        context.isolation.setdefault(outcome.isolation, outcome.isolation_reason)
    if outcome.timed_out:
        log.warning("%s child for %s timed out", job, context.submission.id)
    claim = (outcome.result or {}).get("infrastructure_error")
    if claim is None:
        return
    if outcome.ran_submission and outcome.submission_phase_seen and _a_worker_starts_here(context.options.device):
        # Said after submission code ran (its first phase was announced), and a worker without it starts and
        # finishes here: the candidate's failure, never the machine's (a submission can send any result it likes).
        # Before that phase only harness code had run, so the claim is ours (a task that fails to load, say).
        log.warning("%s worker for %s claimed an infrastructure error that a probe worker did not confirm: %s",
                    job, context.submission.id, str(claim)[:300])
        return
    raise InfrastructureError(f"{job} worker failed: {claim}")


def _base_verdict(context: _Context, status: Status, **fields) -> Verdict:
    task, submission, protocol = context.task, context.submission, context.protocol
    return Verdict(task=task.key, task_name=task.name, level=task.level, problem_id=task.problem_id,
                   submission=submission.id, submission_sha256=submission.sha256, protocol=protocol.name,
                   protocol_sha256=protocol.sha256, status=status, **fields)


def _payload(context: _Context, **extra) -> dict:
    return {"task_source": context.task.source, "task_name": context.task.name,
            "submission_source": context.submission.source, "device": context.options.device, **extra}


def _count_worker(context: _Context, job: str, wall_s: float | None) -> None:
    context.worker_s[job] = context.worker_s.get(job, 0.0) + float(wall_s or 0.0)


def _run(context: _Context, job: str, payload: dict, *, timeout_s: float | None = None,
         writable: tuple = (), pace=None) -> ChildOutcome:
    """One child; with `pace` (kbverify.harness.hang) it is also held to the hang budget that pace informs."""
    timeout_s = timeout_s or context.options.timeout_s
    if pace is None:
        outcome = run_child(job, payload, timeout_s=timeout_s, device=context.options.device, env=context.env,
                            keep_dir=context.options.keep_workdirs, writable=writable)
    else:
        outcome = run_children([ChildSpec(job, payload, timeout_s, context.options.device, context.env,
                                          context.options.keep_workdirs, writable=writable, hang=context.hang(pace),
                                          pace=pace)])[0]
    _note_child(context, job, outcome)
    return _unclaimed(outcome)


def _unclaimed(outcome: ChildOutcome) -> ChildOutcome:
    """An infrastructure error claimed by submission code and not confirmed (see _note_child) is a death of the
    candidate's: the outcome then reads as a child that died after its candidate phase."""
    if outcome.result and "infrastructure_error" in outcome.result and outcome.submission_phase_seen:
        return replace(outcome, result=None, submission_phase_seen=True,
                                   last_phase=outcome.last_phase or "candidate:unconfirmed-infrastructure-claim")
    return outcome


def _run_pair(context: _Context, first: tuple[str, dict], second: tuple[str, dict], outdir: str, markers: dict):
    """The candidate's payload names only the judge's marker and the judge's only the candidate's (see channel)."""
    first = (first[0], {**first[1], "markers": {"judge_ended": markers["judge_ended"]}})
    second = (second[0], {**second[1], "markers": {"candidate_ended": markers["candidate_ended"]}})

    def marker(name):
        return lambda: write_marker(os.path.join(outdir, name))

    pace = hang_module.ReferencePace()  # the judge's phases: how long the reference's own work takes
    # Correctness workers of units sharing a GPU run on the run's MPS daemon, if any, so their kernels overlap;
    # timing workers never do (they run as they run alone).
    env = {**context.env, **dict(context.options.sharing.correctness_env if context.options.sharing else ())}
    specs = [ChildSpec(first[0], first[1], context.options.timeout_s, context.options.device, env,
                       context.options.keep_workdirs, on_exit=marker(markers["candidate_ended"]), writable=(outdir,),
                       hang=context.hang(pace)),
             ChildSpec(second[0], second[1], context.options.timeout_s, context.options.device, env,
                       context.options.keep_workdirs, on_exit=marker(markers["judge_ended"]), writable=(outdir,), pace=pace)]
    outcomes = run_children(specs)
    context.reference_call_s = pace.call_s
    for spec, outcome in zip(specs, outcomes):
        _note_child(context, spec.job, outcome)
    return [_unclaimed(outcome) for outcome in outcomes]


def _died(outcome: ChildOutcome, party: str, device: str) -> tuple[Status, str]:
    """A child that did not report (kbverify.judge.death), once a probe worker has said whether a child that died
    starting up is ours."""
    if judge.died_starting_up(outcome) and not _a_worker_starts_here(device):
        raise InfrastructureError(f"the {party} worker died before it started (exit code {outcome.exit_code}): "
                                  f"{(outcome.output_tail or outcome.output_head).strip()[-300:]}")
    return judge.death(outcome, party)


def _a_worker_starts_here(device: str) -> bool:
    """A job with nothing to run, started as every real job is (a "probe" job would skip bringing up CUDA)."""
    probe = run_child("build", {"submission_source": "", "device": device}, timeout_s=PROBE_WORKER_TIMEOUT_S,
                      device=device)
    return not probe.died and bool((probe.result or {}).get("ok"))


def _confirm_machine_failure(context: _Context, build: BuildRecord) -> BuildRecord:
    """A build this machine cannot make (no nvcc, the compiler killed, the disk full) says nothing about the
    submission: an infrastructure error, so the unit is retried and never scored. The build's output says so,
    but the submission writes that output, so a trivial extension is built to confirm it (kbverify.harness.toolchain);
    if that builds, the failure is the submission's and stays a compile error."""
    if build.error_class != "toolchain":
        return build
    last_line = (build.error.strip().splitlines() or [""])[-1][-300:]
    reason = toolchain.cannot_build_here(context.options.device, context.env)
    if reason is not None:
        raise InfrastructureError(f"this machine cannot build native extensions ({reason.strip()[-300:]}); the "
                                  f"submission's build failed with: {last_line}")
    log.warning("%s: its build failed like a machine failure (%s), but a probe extension built here",
                context.submission.id, last_line)
    return replace(build, error_class="toolchain_unconfirmed")


# ---- original: KernelBench v0.1 --------------------------------------------------------------------------

def _check_kernelbench(context: _Context) -> Verdict:
    protocol = context.protocol
    common = {"trials": protocol.trials, "timing_trials": protocol.timing_trials, "warmup_calls": protocol.warmup_calls,
              "device_warmup_s": protocol.device_warmup_s,
              "baseline_matmul_tf32": protocol.baseline_matmul_tf32,
              "baseline_cudnn_tf32": protocol.baseline_cudnn_tf32,
              "candidate_grad_enabled": protocol.candidate_grad_enabled}
    _look_at_gpu(context, "before")  # this one job checks and times
    # held to the hang budget, as verified is; the reference's pace is its baseline, timed before the submission
    pace = hang_module.BaselinePace(protocol.warmup_calls + protocol.timing_trials, protocol.device_warmup_s)
    evaluation = _run(context, "kernelbench_eval", _payload(context, baseline_first=True, **common), pace=pace)
    _look_at_gpu(context, "after")
    if evaluation.died:
        status, detail = _died(evaluation, "candidate", context.options.device)
        build = judge.build_record(context.static, None)
        return _base_verdict(context, status, message=detail, build=build,
                             warnings=tuple(judge.code_path_warnings(context.static, build)))
    decided = judge.decide_kernelbench(evaluation.result, context.static, protocol)
    build = decided.build
    if decided.status is Status.COMPILE_ERROR:
        build = _confirm_machine_failure(context, build)
    return _base_verdict(context, decided.status, message=decided.message, warnings=decided.warnings,
                         speedup=decided.speedup, ref_time_ms=decided.ref_time_ms, cand_time_ms=decided.cand_time_ms,
                         timing=decided.timing, build=build,
                         reproducer={"protocol": context.protocol.name, "seed": 42})


# ---- isolated: kbv, verified -------------------------------------------------------------------------------

def _check_isolated(context: _Context, margin_cache) -> Verdict:
    """Correctness, then (for a kernel that passed) timing: each phase under its own lease of a shared device, so
    other units' correctness runs beside this one's and nothing runs beside its timing."""
    protocol, options = context.protocol, context.options
    secret = options.secret or new_run_secret()
    with _phase(context, device_share.CORRECTNESS):
        verdict = _correctness_isolated(context, secret)
    if verdict.status is Status.PASSED and options.measure_speed:
        if protocol.timing == "kernelbench":
            with _phase(context, device_share.TIMING):
                return _time_kernelbench_way(context, verdict)
        outdir = tempfile.mkdtemp(prefix="kbverify-timed-")  # the chosen timed outputs' copies, this process's
        try:
            with _phase(context, device_share.TIMING):  # the clean reference measures too
                measured = _time_isolated(context, verdict, secret, outdir)
            if isinstance(measured, Verdict):  # the timing itself failed: no outputs to check
                return measured
            # The check of the timed outputs runs no submission code and times nothing: beside other units'
            # correctness
            with _phase(context, device_share.CORRECTNESS):
                timed_outputs = _check_timed_outputs(context, measured.payload, measured.driven, outdir)
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
        return _timing_verdict(context, verdict, measured, margin_cache, timed_outputs)
    return verdict


def _correctness_isolated(context: _Context, secret: str) -> Verdict:
    protocol = context.protocol
    plan, origin = input_plan.plan_for(context.task, protocol, hidden_dirs=context.options.hidden_dirs,
                                       only=context.options.only, secret=secret)
    sets = [s.to_dict() for s in plan]
    outdir = tempfile.mkdtemp(prefix="kbverify-outputs-")
    markers = marker_names()
    try:
        flags = {"train_mode": protocol.train_mode, "guards": protocol.guards, "sets": sets, "outdir": outdir}
        judge_payload = _payload(context, submission_source="", **flags,
                                 reference_tf32=protocol.reference_tf32,
                                 reference_cudnn_tf32=protocol.reference_cudnn_tf32,
                                 baseline_tf32=protocol.rule == "verified",
                                 fp64_reference=protocol.rule == "verified",
                                 nudge_seeds={s["set_id"]: derive_seed(secret, "nudge", s["set_id"]) for s in sets})
        # Side by side: the candidate hands over one output at a time and the judge takes it (evaluate.py).
        candidate, judged = _run_pair(context, ("candidate", _payload(context, **flags)), ("judge", judge_payload),
                                     outdir, markers)
        if candidate.died:
            status, detail = _died(candidate, "candidate", context.options.device)
            build = judge.build_record(context.static, None)
            return _base_verdict(context, status, message=detail, build=build, hidden_shapes=origin,
                                 warnings=tuple(judge.code_path_warnings(context.static, build)),
                                 reproducer=judge.reproducer(protocol, secret, None))
        if judged.died:
            _died(judged, "reference", context.options.device)  # ours, if a worker cannot start here
            status, detail = judge.reference_death(judged)
            return _base_verdict(context, status, message=detail, hidden_shapes=origin)
        claimed = evidence.from_child(candidate.result, ran_submission=candidate.ran_submission,
                                      source="the candidate's worker", schema=evidence.CANDIDATE_SCHEMA)
        computed = evidence.from_child(judged.result, ran_submission=judged.ran_submission,
                                       source="the judge's worker", schema=evidence.JUDGE_SCHEMA)
        fault = judge.judge_infrastructure(computed)
        if fault is not None:  # the judge's process has no submission code: its word is the machine's state
            raise InfrastructureError(fault)
        # the parent's own look at the folder, not the candidate's word: a record of its own
        observed = evidence.observed("the parent's listing of the hand-over folder", {
            "handover_strays": handover_strays(outdir, [s["set_id"] for s in sets], markers)})
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    set_results = judge.merge_set_records(plan, claimed, computed, protocol)
    build = judge.build_record(context.static, claimed.plain().get("extensions"))
    decided = judge.decide_isolated(set_results, claimed, context.static, build, protocol, observed)
    if decided.status is Status.COMPILE_ERROR:  # its load error: the machine's, if a probe build fails too
        build = _confirm_machine_failure(context, build)
    kept = input_plan.kept_axes_note(context.task, protocol, context.options.hidden_dirs)
    decided = judge.with_kept_axes(decided, kept)
    return _base_verdict(context, decided.status, message=decided.message, build=build, warnings=decided.warnings,
                         sets=tuple(set_results), hidden_shapes=origin,
                         reproducer=judge.reproducer(protocol, secret, decided.failing))


def _time_kernelbench_way(context: _Context, verdict: Verdict) -> Verdict:
    """Mean of a few trials for the candidate, and the baseline alone in a clean process (KernelBench-Verified)."""
    protocol = context.protocol
    common = {"timing_trials": protocol.timing_trials, "warmup_calls": protocol.warmup_calls,
              "device_warmup_s": protocol.device_warmup_s,
              "baseline_matmul_tf32": protocol.baseline_matmul_tf32,
              "baseline_cudnn_tf32": protocol.baseline_cudnn_tf32,
              "candidate_grad_enabled": protocol.candidate_grad_enabled}
    _look_at_gpu(context, "before")
    timed = _run(context, "kernelbench_candidate_timing", _payload(context, **common))
    if timed.died:
        status, detail = _died(timed, "candidate", context.options.device)
        return replace(verdict, status=status, message="while timed: " + detail)
    if "runtime_ms" not in (timed.result or {}):
        status, detail = judge.kernelbench_timing_error(timed.result or {})
        return replace(verdict, status=status, message=detail)
    baseline = _run(context, "kernelbench_baseline", _payload(context, submission_source="", **common))
    _look_at_gpu(context, "after")
    if baseline.died or "runtime_ms" not in (baseline.result or {}):
        status, detail = judge.untimed_reference()
        return replace(verdict, status=status, message=detail)
    ref_ms, cand_ms = baseline.result["runtime_ms"], timed.result["runtime_ms"]
    speedup, excessive = judge.speedup_of(ref_ms, cand_ms, protocol.rules)
    warnings = list(verdict.warnings) + excessive
    return replace(verdict, speedup=speedup, ref_time_ms=ref_ms, cand_time_ms=cand_ms,
                               warnings=tuple(dict.fromkeys(warnings)),
                               timing={"kernelbench": timed.result, "baseline": baseline.result})


# ---- timing ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Measured:
    """What the exclusive part of a verified timing measured, for the parts that follow it."""

    payload: dict
    record: dict  # the candidate's timing worker's record (claimed); the rounds are the parent's, in `driven`
    reference: dict  # the reference's timing worker's record (computed: it never ran submission code)
    driven: object  # timing_control.Driven of both workers' rounds
    clean: dict | None  # the clean reference's record and rounds (None: not measured, or its worker died)


def _time_isolated(context: _Context, verdict: Verdict, secret: str, outdir: str) -> "Verdict | _Measured":
    protocol = context.protocol
    payload = _payload(context, secret=secret, budget_s=protocol.timing_budget_s,
                       norm_rtol=protocol.norm_rtol or protocol.rtol, baseline_allowance=protocol.baseline_allowance,
                       warmup_s=protocol.device_warmup_s,
                       ci_half_width=protocol.ci_half_width, train_mode=protocol.train_mode,
                       baseline_matmul_tf32=protocol.baseline_matmul_tf32,
                       baseline_cudnn_tf32=protocol.baseline_cudnn_tf32,
                       candidate_grad_enabled=protocol.candidate_grad_enabled,
                       timed_distributions=input_plan.timed_distributions(verdict.sets, protocol),
                       reference_tf32=protocol.reference_tf32, reference_cudnn_tf32=protocol.reference_cudnn_tf32,
                       baseline_tf32=protocol.rule == "verified", fp64_reference=protocol.rule == "verified",
                       outdir=outdir)
    _look_at_gpu(context, "before")
    outcomes, driven = _driven(context, {"ref": ("reference_timing", {**payload, "submission_source": ""}),
                                         "cand": ("timing", payload)},
                               budget_s=protocol.timing_budget_s, target=protocol.ci_half_width, outdir=outdir)
    timed = outcomes["cand"]
    if timed.died:
        status, detail = _died(timed, "candidate", context.options.device)
        return replace(verdict, status=status, message="while timed: " + detail)
    claimed = evidence.from_child({key: value for key, value in timed.result.items() if key not in ("rounds", "stale")},
                                  ran_submission=timed.ran_submission, source="the candidate's timing worker",
                                  schema=evidence.TIMING_SCHEMA)
    reference = evidence.from_child(outcomes["ref"].result, ran_submission=outcomes["ref"].ran_submission,
                                    source="the reference's timing worker", schema=evidence.TIMING_SCHEMA)
    failed_side, stopped = driven.failed_side, driven.stopped
    if outcomes["ref"].died and failed_side != "cand":
        failed_side, stopped = "ref", stopped or "its worker died (" + outcomes["ref"].timeline() + ")"
    failure = judge.timed_failure(claimed, protocol, forged=driven.forged, stopped=stopped, failed_side=failed_side,
                                  exit_code=timed.exit_code, reference=reference)
    if failure is not None:
        return replace(verdict, status=failure[0], message=failure[1])
    clean = _clean_reference(context, payload) if protocol.guards else None
    _look_at_gpu(context, "after")
    return _Measured(payload, claimed.plain(), reference.plain(), driven, clean)


def _clean_reference(context: _Context, payload: dict) -> dict | None:
    """Two copies of the reference, each in a worker without submission code, timed against each other as the
    candidate is: the noise margin, and the reference's time where it ran slower beside the candidate."""
    clean = {**payload, "submission_source": ""}
    outcomes, driven = _driven(context, {"ref": ("reference_timing", clean), "cand": ("reference_timing", clean)},
                               budget_s=max(0.5, context.protocol.timing_budget_s / 2),
                               target=context.protocol.ci_half_width, check=False)
    died = any(outcome.died for outcome in outcomes.values()) or driven.failed_side
    return None if died else {**judge.sides_view(outcomes["ref"].result, outcomes["cand"].result),
                              "rounds": driven.rounds}


def _timing_verdict(context: _Context, verdict: Verdict, measured: _Measured, margin_cache,
                    timed_outputs: dict) -> Verdict:
    """The timing record keeps each origin apart (`evidence.TIMING_ORIGINS`)."""
    margin = _noise_margin(context, measured.clean, margin_cache)
    timing = {"origins": dict(evidence.TIMING_ORIGINS), "interleaved": measured.record,
              "reference_worker": measured.reference, "rounds": measured.driven.rounds, "timed_outputs": timed_outputs,
              "clean_reference": measured.clean, "noise_margin": margin,
              "device": context.options.device, "mode_requested": context.options.timing_mode}
    return decide_timing(replace(verdict, timing=timing), context.protocol)


def _driven(context: _Context, workers: dict, *, budget_s: float, target: float, check: bool = True,
            outdir: str | None = None):
    """Timing workers, one per side (side → (job, payload)), driven in the same rounds (kbverify.timing.timing_control):
    the reference's batches go to a worker that never runs submission code. ({side: outcome}, Driven)."""
    options = context.options
    outcomes, driven = timing_control.run(workers, timeout_s=options.timeout_s, device=options.device,
                                          env=context.env, keep_dir=options.keep_workdirs, budget_s=budget_s,
                                          target_half_width=target, check=check,
                                          distributions=workers["cand"][1].get("timed_distributions") or ("x1",),
                                          hang=context.hang(),
                                          kinds=timing_control.kinds_for(options.device, options.timing_mode),
                                          outdir=outdir if check else None,
                                          rules=context.protocol.rules)
    for side, outcome in outcomes.items():
        _note_child(context, workers[side][0], outcome)
    return {side: _unclaimed(outcome) for side, outcome in outcomes.items()}, driven


def _check_timed_outputs(context: _Context, payload: dict, driven, outdir: str) -> dict:
    """The chosen timed outputs' copies against the reference, in a worker without submission code: its record is
    computed evidence (kbverify.worker.timing_check), judged by kbverify.judge.timing."""
    if not driven.checks:
        return {"checked": 0, "calls": []}
    checked = _run(context, "timing_check", {**payload, "submission_source": "", "checks": driven.checks},
                   writable=(outdir,))
    if checked.died:
        raise InfrastructureError("the timed outputs could not be checked: the checking worker died "
                                  f"({(checked.output_tail or checked.output_head).strip()[-300:]})")
    return checked.result


def _noise_margin(context: _Context, clean: dict | None, margin_cache) -> float:
    key = f"aa-margin|{context.task.sha256}|{provenance_module.compat_key(provenance_module.collect(context.options.device))}"
    if margin_cache is not None:
        cached = margin_cache.get(key)
        if cached is not None:
            return float(cached)
    if clean is None or not clean.get("rounds"):
        return context.protocol.rules.default_noise_margin
    rounds = [(r["ref_ms"], r["cand_ms"]) for r in clean["rounds"]]
    margin = float(stats.noise_margin_from_aa(rounds, floor=context.protocol.rules.default_noise_margin))
    if margin_cache is not None:
        margin_cache.put(key, margin)
    return margin
