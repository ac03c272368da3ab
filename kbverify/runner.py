"""One (task, submission, protocol) → one Verdict. The parent side: it plans, starts children, and turns their raw
records into statuses. It never imports a submission.

Deciding is separate from running: `decide_isolated` and `decide_timing` (kbverify.timing_verdict) read only
stored raw records, so `rejudge` reaches the same verdicts from a store without a GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kbverify import hang as hang_module
from kbverify import provenance as provenance_module
from kbverify import device_share, gpu_processes, stats, timing_control, toolchain
from kbverify.channel import handover_strays, marker_names
from kbverify.correctness import ExactEvidence, judge_set
from kbverify.errors import InfrastructureError
from kbverify.inputs import InputSet, derive_seed, new_run_secret, plan_input_sets
from kbverify.protocols import Protocol
from kbverify.records import BuildRecord, SetResult, Verdict
from kbverify.sandbox import ChildOutcome, ChildSpec, run_child, run_children
from kbverify.static import StaticScan, classify_build_error, scan
from kbverify.status import Status, Warn, worst
from kbverify.submissions import Submission
from kbverify.tasks import Task
from kbverify.timing_verdict import EXCESSIVE_SPEEDUP, _refusal, decide_timing  # noqa: F401 - decide_timing: API

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
    hang_factor: float = hang_module.FACTOR  # (kbverify.hang; a floor of 0 leaves only --timeout)
    timing_mode: str = "auto"  # "auto": kbverify.timing_modes decides; "hold" or "sync" ask for one (tests)
    max_jobs: int | None = None  # compiler processes per native build (MAX_JOBS); None: $MAX_JOBS, else every core
    # The device's lease when several units share it (kbverify.device_share): correctness under the shared lease,
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
    gpu_checks: list = field(default_factory=list)  # kbverify.gpu_processes.check records around the timing

    def hang(self, pace=None):
        return hang_module.HangBudget(self.options.hang_floor_s, self.options.hang_factor, self.reference_call_s, pace)


def default_build_cache() -> Path:
    return Path(os.environ.get("KBVERIFY_CACHE", Path.home() / ".cache" / "kbverify")) / "builds"


def build_env(submission: Submission, options: CheckOptions) -> dict:
    """Builds are keyed by the submission's content hash: same-named extensions of two submissions never meet."""
    root = (options.build_cache or default_build_cache()) / submission.sha256[:20]
    root.mkdir(parents=True, exist_ok=True)
    env = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"), "TRITON_CACHE_DIR": str(root / "triton"),
           "MAX_JOBS": str(options.max_jobs or os.environ.get("MAX_JOBS") or max(1, os.cpu_count() or 1))}
    if not options.device.startswith("cuda"):
        env["TRITON_INTERPRET"] = "1"
    return env


def check(task: Task, submission: Submission, protocol: Protocol, options: CheckOptions, *,
          sample: int = 0, claimed_speedup: float | None = None, margin_cache=None) -> Verdict:
    started = time.monotonic()
    provenance_module.prefetch(options.device)
    context = _Context(task, submission, protocol, options, scan(submission.source),
                       build_env(submission, options))
    if protocol.isolated:
        verdict = _check_isolated(context, margin_cache)
    else:
        with _phase(context, device_share.TIMING):  # its one job checks and times: timing, so alone
            verdict = _check_kernelbench(context)
    verdict = _with_gpu_checks(context, verdict)
    isolation, reason = _isolation(context)
    shared = {"device_share": options.sharing.provenance()} if options.sharing else {}
    return dataclasses.replace(
        verdict, sample=sample, claimed_speedup=claimed_speedup, elapsed_s=time.monotonic() - started,
        worker_s=dict(context.worker_s), isolation=isolation, isolation_reason=reason,
        provenance={**provenance_module.collect(options.device), "protocol_sha256": protocol.sha256, **shared})


def _phase(context: _Context, kind: str):
    """The device's lease of `kind` (kbverify.device_share) around a phase, where the device is shared."""
    return device_share.phase(context.options.sharing, kind,
                              f"{context.task.name}/{context.submission.id}/{context.protocol.name}")


def _isolation(context: _Context) -> tuple[str, str]:
    """Degraded if any process that ran this submission's code ran unconfined."""
    if "degraded" in context.isolation:
        return "degraded", context.isolation["degraded"]
    if "isolated" in context.isolation:
        return "isolated", context.isolation["isolated"]
    if not context.ran_submission:
        # rejected before any process ran its code (it did not parse, has no ModelNew): nothing to confine
        return "not_run", "no process ran the submission's code"
    return "degraded", "no process reported how it was confined"


def _look_at_gpu(context: _Context, when: str) -> None:
    """Which compute processes hold the device, right before a timing worker starts or after the last ended. The
    run's own MPS server is not foreign: it is the daemon's child, not ours, and holds the device between clients."""
    sharing = context.options.sharing
    context.gpu_checks.append(gpu_processes.check(context.options.device, when,
                                                  ours_env=dict(sharing.correctness_env) if sharing else None))


def _with_gpu_checks(context: _Context, verdict: Verdict) -> Verdict:
    """A timed verdict carries what the looks at its device found, and is flagged where a foreign process held it
    (its speedup then does not count in fast_p: kbverify.counting.score_rows_from_verdicts) or where a GPU went
    unchecked."""
    if not verdict.timing or not context.gpu_checks:
        return verdict
    warnings = list(verdict.warnings) + gpu_processes.warnings_for(context.gpu_checks, context.options.device)
    return dataclasses.replace(verdict, timing={**verdict.timing, "gpu_processes": list(context.gpu_checks)},
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


def _run(context: _Context, job: str, payload: dict, *, timeout_s: float | None = None) -> ChildOutcome:
    outcome = run_child(job, payload, timeout_s=timeout_s or context.options.timeout_s, device=context.options.device,
                        env=context.env, keep_dir=context.options.keep_workdirs)
    _note_child(context, job, outcome)
    return _unclaimed(outcome)


def _unclaimed(outcome: ChildOutcome) -> ChildOutcome:
    """An infrastructure error claimed by submission code and not confirmed (see _note_child) is a death of the
    candidate's: the outcome then reads as a child that died after its candidate phase."""
    if outcome.result and "infrastructure_error" in outcome.result and outcome.submission_phase_seen:
        return dataclasses.replace(outcome, result=None, submission_phase_seen=True,
                                   last_phase=outcome.last_phase or "candidate:unconfirmed-infrastructure-claim")
    return outcome


def _run_pair(context: _Context, first: tuple[str, dict], second: tuple[str, dict], outdir: str, markers: dict):
    """The candidate's payload names only the judge's marker and the judge's only the candidate's (see channel)."""
    first = (first[0], {**first[1], "markers": {"judge_ended": markers["judge_ended"]}})
    second = (second[0], {**second[1], "markers": {"candidate_ended": markers["candidate_ended"]}})

    def marker(name):
        return lambda: _write_marker(os.path.join(outdir, name))

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


def _write_marker(path: str) -> None:
    """The hand-over folder is the candidate's to write: a name it planted as a link must not lead this process
    (which may run as root) to truncate what the link points to."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError as error:
        log.warning("could not mark %s: %s", path, error)


def _died(outcome: ChildOutcome, party: str, device: str) -> tuple[Status, str]:
    """A child that did not report: blame the candidate only if it was running candidate code.

    The phases are the child's own messages, so once submission code has run (a candidate phase was announced)
    the ones after it are the submission's to choose: from then on the death is the candidate's whatever phase
    it last named. Before that the phase record is ours and names the party."""
    if outcome.build_dir_over:  # the parent's own measure of what the job left on the host's disk
        return Status.RUNTIME_ERROR, f"its build folder outgrew its bound and was emptied: {outcome.build_dir_over}"
    tainted = outcome.ran_submission and outcome.submission_phase_seen
    where = (outcome.last_phase if not tainted or outcome.last_phase.startswith("candidate")
             else f"{outcome.last_phase} (announced after submission code ran)") or "start-up"
    if not outcome.last_phase and not outcome.timed_out:
        # No phase recorded: it died starting up, which is ours, unless a worker starts here fine.
        if not _a_worker_starts_here(device):
            raise InfrastructureError(f"the {party} worker died before it started (exit code {outcome.exit_code}): "
                                      f"{(outcome.output_tail or outcome.output_head).strip()[-300:]}")
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


def _candidate_phase(phase: str, party: str) -> bool:
    return phase.startswith("candidate") or (party == "candidate" and not phase.startswith("reference"))


def _a_worker_starts_here(device: str) -> bool:
    """A job with nothing to run, started as every real job is (a "probe" job would skip bringing up CUDA)."""
    probe = run_child("build", {"submission_source": "", "device": device}, timeout_s=PROBE_WORKER_TIMEOUT_S,
                      device=device)
    return not probe.died and bool((probe.result or {}).get("ok"))


def _build_record(static: StaticScan, extensions: dict | None) -> BuildRecord:
    extensions = extensions or {}
    attempts = extensions.get("attempts", 0)
    built = extensions.get("built", 0) > 0 if attempts else (None if not static.native_sources else False)
    errors = extensions.get("errors") or []
    error = errors[-1] if errors else ""
    return BuildRecord(native_sources=static.native_sources, extension_built=built,
                       extension_called=(extensions.get("calls", 0) > 0) if built else None,
                       error_class=classify_build_error(error) if error else None, error=error[-3000:],
                       triton=static.triton, triton_kernels_run=_count_or_none(extensions.get("triton_kernels_run")))


def _count_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _confirm_machine_failure(context: _Context, build: BuildRecord) -> BuildRecord:
    """A build this machine cannot make (no nvcc, the compiler killed, the disk full) says nothing about the
    submission: an infrastructure error, so the unit is retried and never scored. The build's output says so,
    but the submission writes that output, so a trivial extension is built to confirm it (kbverify.toolchain);
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
    return dataclasses.replace(build, error_class="toolchain_unconfirmed")


def code_path_warnings(static: StaticScan, build: BuildRecord) -> list[str]:
    warnings: list[str] = []
    if static.syntax_error:
        return warnings
    if static.native_sources and not build.extension_built:
        warnings.append(Warn.EXTENSION_NOT_BUILT.value)
    # what ran, where it is known: a triton import whose kernels never compiled is no custom code (an unknown
    # count keeps the static scan's reading)
    triton_ran = static.triton and build.triton_kernels_run != 0
    native_ran = static.native_sources and build.extension_called is not False
    if not static.has_custom_code or not (triton_ran or native_ran):
        warnings.append(Warn.PYTORCH_ONLY.value)
    return warnings


# ---- original: KernelBench v0.1 --------------------------------------------------------------------------

def _check_kernelbench(context: _Context) -> Verdict:
    protocol = context.protocol
    common = {"trials": protocol.trials, "timing_trials": protocol.timing_trials, "warmup_calls": protocol.warmup_calls,
              "device_warmup_s": protocol.device_warmup_s,
              "baseline_matmul_tf32": protocol.baseline_matmul_tf32,
              "baseline_cudnn_tf32": protocol.baseline_cudnn_tf32,
              "candidate_grad_enabled": protocol.candidate_grad_enabled}
    _look_at_gpu(context, "before")  # this one job checks and times
    evaluation = _run(context, "kernelbench_eval", _payload(context, baseline_first=True, **common))
    _look_at_gpu(context, "after")
    if evaluation.died:
        status, detail = _died(evaluation, "candidate", context.options.device)
        return _base_verdict(context, status, message=detail,
                             build=_build_record(context.static, None),
                             warnings=tuple(code_path_warnings(context.static, _build_record(context.static, None))))
    record = evaluation.result
    build = _build_record(context.static, record.get("extensions"))
    warnings = code_path_warnings(context.static, build)
    if record.get("namespace_rebind"):
        warnings.append(Warn.NAMESPACE_REBIND.value)
    status, message = _kernelbench_status(record)
    if status is Status.COMPILE_ERROR:
        build = _confirm_machine_failure(context, build)
    timing = {"kernelbench": {key: record.get(key) for key in ("times_ms", "runtime_stats", "runtime_ms",
                                                                "input_shapes", "error_during_performance")},
              "trials": record.get("trials"), "namespace_rebind": record.get("namespace_rebind")}
    speedup = ref_ms = cand_ms = None
    if status is Status.PASSED and record.get("runtime_ms"):
        baseline = record.get("baseline") or {}
        if "runtime_ms" not in baseline:
            status, message = Status.UNVERIFIABLE, "the reference could not be timed: " + baseline.get("error", "")
        else:
            timing["baseline"] = baseline
            ref_ms, cand_ms = baseline["runtime_ms"], record["runtime_ms"]
            speedup = ref_ms / cand_ms if cand_ms > 0 else math.inf
            if speedup > EXCESSIVE_SPEEDUP:
                warnings.append(Warn.EXCESSIVE_SPEEDUP.value)
            if baseline.get("input_shapes") != record.get("input_shapes"):
                timing["input_shapes_differ"] = True
    return _base_verdict(context, status, message=message, warnings=tuple(dict.fromkeys(warnings)),
                         speedup=speedup, ref_time_ms=ref_ms, cand_time_ms=cand_ms, timing=timing, build=build,
                         reproducer={"protocol": context.protocol.name, "seed": 42})


def _kernelbench_status(record: dict) -> tuple[Status, str]:
    if not record.get("compiled"):
        return Status.COMPILE_ERROR, record.get("compilation_error", "")
    if record.get("runtime_error"):
        return Status.RUNTIME_ERROR, record["runtime_error"]
    if record.get("correctness_issue") == "shape_mismatch":
        shape = next((t["shape_mismatch"] for t in record.get("trials", []) if "shape_mismatch" in t), "")
        return Status.SHAPE_MISMATCH, shape
    if not record.get("correctness"):
        failed = [t for t in record.get("trials", []) if not t.get("passed")]
        detail = f"{record.get('correctness_trials', '')} trials passed"
        if failed:
            detail += f"; max difference {failed[0].get('max_difference')}"
        return Status.INCORRECT, detail
    if record.get("error_during_performance"):
        return Status.RUNTIME_ERROR, "failed while timed: " + record["error_during_performance"]
    return Status.PASSED, ""


# ---- isolated: kbv, verified -------------------------------------------------------------------------------

_GENERATED_SHAPES: dict[str, list] = {}


def hidden_shapes_for(task: Task, hidden_dirs, device: str = "cpu") -> tuple[list, str]:
    """Committed manifests are read here; shapes for a task without one are generated in a worker, because
    generating executes the task's code and a published run's reference is untrusted (SPEC §7)."""
    from kbverify import hidden

    shapes = hidden.committed_shapes(task, hidden_dirs)
    if shapes is not None:
        return shapes, "committed" if shapes else "none"
    if task.sha256 not in _GENERATED_SHAPES:
        outcome = run_child("hidden", {"task_source": task.source, "task_name": task.name, "device": "cpu"},
                            timeout_s=300, device="cpu")
        result = outcome.result or {}
        if "shapes" not in result:
            log.warning("hidden shapes for %s could not be generated: %s", task.name,
                        result.get("infrastructure_error") or outcome.output_tail[-300:])
        _GENERATED_SHAPES[task.sha256] = [hidden.HiddenShape.from_json(s) for s in result.get("shapes", [])]
    shapes = _GENERATED_SHAPES[task.sha256]
    return shapes, "generated" if shapes else "none"


def _shapes(context: _Context) -> tuple[list[tuple[str, dict]], str]:
    shapes: list[tuple[str, dict]] = [("original", {})]
    if not context.protocol.hidden_shapes:
        return shapes, "none"
    hidden_shapes, origin = hidden_shapes_for(context.task, list(context.options.hidden_dirs))
    shapes += [(shape.label, dict(shape.overrides)) for shape in hidden_shapes]
    return shapes, origin


def plan_for(context: _Context, secret: str) -> tuple[list[InputSet], str]:
    shapes, origin = _shapes(context)
    plan = plan_input_sets(context.protocol, shapes, secret=secret)
    if context.options.only:
        plan = [s for s in plan if s.set_id == context.options.only or s.set_id.startswith(context.options.only)]
    return plan, origin


def _check_isolated(context: _Context, margin_cache) -> Verdict:
    """Correctness, then (for a kernel that passed) timing: each phase under its own lease of a shared device, so
    other units' correctness runs beside this one's and nothing runs beside its timing."""
    protocol, options = context.protocol, context.options
    secret = options.secret or new_run_secret()
    with _phase(context, device_share.CORRECTNESS):
        verdict = _correctness_isolated(context, secret)
    if verdict.status is Status.PASSED and options.measure_speed:
        with _phase(context, device_share.TIMING):  # the A/A margin and the clean reference measure too
            if protocol.timing == "kernelbench":
                return _time_kernelbench_way(context, verdict)
            return _time_isolated(context, verdict, secret, margin_cache)
    return verdict


def _correctness_isolated(context: _Context, secret: str) -> Verdict:
    protocol = context.protocol
    plan, origin = plan_for(context, secret)
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
        candidate, judge = _run_pair(context, ("candidate", _payload(context, **flags)), ("judge", judge_payload),
                                     outdir, markers)
        if candidate.died:
            status, detail = _died(candidate, "candidate", context.options.device)
            build = _build_record(context.static, None)
            return _base_verdict(context, status, message=detail, build=build, hidden_shapes=origin,
                                 warnings=tuple(code_path_warnings(context.static, build)),
                                 reproducer=_reproducer(protocol, secret, None))
        if judge.died:
            status, detail = _died(judge, "reference", context.options.device)
            return _base_verdict(context, Status.UNVERIFIABLE, message="reference/judge failed: " + detail,
                                 hidden_shapes=origin)
        strays = handover_strays(outdir, [s["set_id"] for s in sets], markers)
        if strays:  # the parent's own look at the folder, not the candidate's word
            candidate.result["tampered"] = [*(candidate.result.get("tampered") or []),
                                            "hand-over folder: " + ", ".join(strays[:6])]
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    set_results = merge_set_records(plan, candidate.result, judge.result, protocol)
    build = _build_record(context.static, candidate.result.get("extensions"))
    return decide_isolated(context, set_results, candidate.result, build, origin, secret)


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
    if timed.died or "runtime_ms" not in (timed.result or {}):
        if timed.died:
            status, detail = _died(timed, "candidate", context.options.device)
        else:
            status, detail = Status.RUNTIME_ERROR, timed.result["error"]
        return dataclasses.replace(verdict, status=status, message="while timed: " + detail)
    baseline = _run(context, "kernelbench_baseline", _payload(context, submission_source="", **common))
    _look_at_gpu(context, "after")
    if baseline.died or "runtime_ms" not in (baseline.result or {}):
        return dataclasses.replace(verdict, status=Status.UNVERIFIABLE, message="the reference could not be timed")
    ref_ms, cand_ms = baseline.result["runtime_ms"], timed.result["runtime_ms"]
    speedup = ref_ms / cand_ms if cand_ms > 0 else math.inf
    warnings = list(verdict.warnings) + ([Warn.EXCESSIVE_SPEEDUP.value] if speedup > EXCESSIVE_SPEEDUP else [])
    return dataclasses.replace(verdict, speedup=speedup, ref_time_ms=ref_ms, cand_time_ms=cand_ms,
                               warnings=tuple(dict.fromkeys(warnings)),
                               timing={"kernelbench": timed.result, "baseline": baseline.result})


def _reproducer(protocol: Protocol, secret: str, failing: SetResult | None) -> dict:
    reproducer = {"protocol": protocol.name, "protocol_sha256": protocol.sha256, "secret": secret}
    if failing is not None:
        reproducer.update({"set": failing.set_id, "seed": failing.seed, "shape": failing.shape,
                           "distribution": failing.distribution, "weights": failing.weights,
                           "worst": (failing.errors.get("comparison", {}).get("outputs") or [{}])[0].get("worst")})
    return reproducer


def merge_set_records(plan: list[InputSet], candidate: dict, judge: dict, protocol: Protocol) -> list[SetResult]:
    """Join each set's candidate-side guard evidence with the judge's comparison; decide its status."""
    results = []
    for input_set in plan:
        cand = (candidate.get("sets") or {}).get(input_set.set_id)
        ref = (judge.get("sets") or {}).get(input_set.set_id, {"valid": False, "invalid_reason": "not judged"})
        errors = {key: ref[key] for key in ("comparison", "baseline", "reference_vs_fp64", "ref_mutates_inputs",
                                            "ref_outputs", "ref_dtypes", "invalid_reason", "candidate_output_error",
                                            "exact_reference", "candidate_vs_fp64", "baseline_vs_fp64",
                                            "moved_vs_fp64")
                  if key in ref}
        # Whether a set is valid is the judge's to say (it drew the same inputs and ran the reference): the
        # candidate's process claiming it could not draw them is its own failure (decide_set), never a reason
        # to leave the set out.
        valid = (bool(ref.get("valid"))
                 and not str((cand or {}).get("skipped", "")).startswith("weights_not_rerandomized"))
        base = dict(set_id=input_set.set_id, shape=input_set.shape, distribution=input_set.distribution,
                    weights=input_set.weights, seed=input_set.seed, valid=valid, errors=errors,
                    guards=cand or {})
        status, detail = decide_set(cand, ref, protocol, candidate)
        results.append(SetResult(status=status, detail=detail, **base))
    return results


def decide_set(cand: dict | None, ref: dict, protocol: Protocol, candidate_record: dict) -> tuple[Status, str]:
    if candidate_record.get("load_error"):
        return Status.COMPILE_ERROR, candidate_record["load_error"]
    if cand is None:
        if candidate_record.get("fatal"):
            return Status.CRASHED, "not run: an earlier set ended the CUDA context: " + candidate_record["fatal"]
        # its process exited 0 with a record that leaves out a planned set: the harness writes every one
        return Status.EXPLOIT_TAMPER, "the candidate's record has no entry for this set"
    if cand.get("input_error"):
        if not ref.get("valid"):
            return Status.PASSED, "set invalid for this task: " + ref.get("invalid_reason", "")
        return Status.RUNTIME_ERROR, ("its process could not draw the inputs the judge drew: "
                                      + str(cand["input_error"]))
    if "skipped" in cand:
        reason = cand["skipped"]
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
    if cand.get("bad_output"):
        return Status.INCORRECT, cand["error"]
    if ref.get("candidate_output_error"):
        return Status.INCORRECT, "the candidate's output could not be compared: " + ref["candidate_output_error"]
    if "error" in cand and "outputs" not in cand:
        if not ref.get("valid"):
            return Status.PASSED, "set invalid for this task: " + ref.get("invalid_reason", "")
        return (Status.CRASHED if cand.get("fatal") else Status.RUNTIME_ERROR), cand["error"]
    outputs = cand.get("outputs", {})
    if protocol.guards:
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
    if not ref.get("valid"):
        return Status.PASSED, "set invalid for this task: " + ref.get("invalid_reason", "")
    if "comparison" not in ref:
        if not protocol.guards and (outputs.get("lazy") or outputs.get("no_storage")):
            return Status.UNVERIFIABLE, "no candidate output to compare"
        # the set ran in the candidate's process and the judge got nothing for it: whatever stopped the hand-over
        # (its own code, a file it planted) was on the candidate's side, since the judge's needed nothing of it
        return Status.EXPLOIT_TAMPER, "the candidate ran this set but handed over no output for it"
    outcome, detail, allowance = judge_set(ref["comparison"], ref.get("baseline"), protocol,
                                           ref.get("reference_vs_fp64"), ExactEvidence.from_record(ref))
    if outcome == "shape_mismatch":
        return Status.SHAPE_MISMATCH, detail
    if outcome == "incorrect":
        return Status.INCORRECT, detail
    if protocol.guards and cand.get("deterministic") is False:
        return Status.EXPLOIT_NONDETERMINISTIC, cand.get("determinism_detail", "")
    return Status.PASSED, detail or ("baseline allowance used" if allowance else "")


def decide_isolated(context: _Context, sets: list[SetResult], candidate: dict, build: BuildRecord, origin: str,
                    secret: str) -> Verdict:
    protocol = context.protocol
    warnings = code_path_warnings(context.static, build)
    warnings += [w for w in candidate.get("warnings", []) if w not in warnings]
    if candidate.get("quietly_refused"):
        warnings.append(Warn.AUDIT_HOOK_DROPPED.value)
    if protocol.guards and candidate.get("refused"):
        return _base_verdict(context, Status.EXPLOIT_TAMPER, build=build, warnings=tuple(warnings), sets=tuple(sets),
                             message="tried what a worker refuses: " + ", ".join(candidate["refused"]),
                             hidden_shapes=origin, reproducer=_reproducer(protocol, secret, None))
    if candidate.get("load_error"):
        build = _confirm_machine_failure(context, build)
        return _base_verdict(context, Status.COMPILE_ERROR, message=candidate["load_error"], build=build,
                             warnings=tuple(warnings), hidden_shapes=origin, sets=tuple(sets),
                             reproducer=_reproducer(protocol, secret, None))
    if protocol.guards and candidate.get("tampered"):
        return _base_verdict(context, Status.EXPLOIT_TAMPER, build=build, warnings=tuple(warnings), sets=tuple(sets),
                             message="changed the harness: " + ", ".join(candidate["tampered"][:6]),
                             hidden_shapes=origin, reproducer=_reproducer(protocol, secret, None))
    if candidate.get("threads_started", 0) > 0:
        warnings.append(Warn.THREADS_STARTED.value)
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
    if wide and not any(s.valid for s in wide) and "half_precision" in context.static.suspicious:
        # the one set that separates fp16 from TF32 is invalid for this task, so an fp16 path goes unseen
        warnings.append(Warn.FP16_PATH.value)
    return _base_verdict(context, status, message=message, build=build, warnings=tuple(dict.fromkeys(warnings)),
                         sets=tuple(sets), hidden_shapes=origin, reproducer=_reproducer(protocol, secret, failing))


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


# ---- timing ------------------------------------------------------------------------------------------------

def _time_isolated(context: _Context, verdict: Verdict, secret: str, margin_cache) -> Verdict:
    protocol = context.protocol
    payload = _payload(context, secret=secret, budget_s=protocol.timing_budget_s,
                       norm_rtol=protocol.norm_rtol or protocol.rtol, baseline_allowance=protocol.baseline_allowance,
                       warmup_s=protocol.device_warmup_s,
                       ci_half_width=protocol.ci_half_width, train_mode=protocol.train_mode,
                       baseline_matmul_tf32=protocol.baseline_matmul_tf32,
                       baseline_cudnn_tf32=protocol.baseline_cudnn_tf32,
                       candidate_grad_enabled=protocol.candidate_grad_enabled,
                       timed_distributions=timed_distributions(verdict.sets, protocol))
    _look_at_gpu(context, "before")
    timed, driven = _driven(context, "timing", payload, budget_s=protocol.timing_budget_s,
                            target=protocol.ci_half_width)
    if timed.died:
        status, detail = _died(timed, "candidate", context.options.device)
        return dataclasses.replace(verdict, status=status, message="while timed: " + detail)
    record = {key: value for key, value in timed.result.items() if key not in ("rounds", "stale")}
    if driven.forged:
        return dataclasses.replace(verdict, status=Status.EXPLOIT_TAMPER,
                                   message="the timing worker's replies are not what it measured: " + driven.forged)
    if context.protocol.guards and record.get("refused"):  # before the errors a refusal usually causes
        return dataclasses.replace(verdict, status=Status.EXPLOIT_TAMPER, message=_refusal(record))
    if context.protocol.guards and str(record.get("error", "")).startswith("HarnessChanged"):
        return dataclasses.replace(verdict, status=Status.EXPLOIT_TAMPER, message="while timed: " + record["error"])
    if record.get("load_error") or record.get("error"):
        # "the reference failed" is the worker's word, and the worker ran submission code: it counts only if
        # the reference fails alone too (the clean run below)
        if record.get("error_side") == "reference" and _reference_fails_alone(context, payload):
            return dataclasses.replace(verdict, status=Status.UNVERIFIABLE,
                                       message="the reference failed while timed: " + record["error"])
        return dataclasses.replace(verdict, status=Status.RUNTIME_ERROR,
                                   message="while timed: " + (record.get("load_error") or record.get("error")))
    if driven.stopped:
        # The rounds are the parent's to end: a worker that stopped answering and then exited, whatever result it
        # sent, ended its own timing (a record of its choosing would follow).
        return dataclasses.replace(verdict, status=Status.CRASHED,
                                   message=f"while timed: {driven.stopped}; the worker then exited "
                                           f"(exit code {timed.exit_code}) before its rounds were done")
    record["rounds"] = driven.rounds
    record["stale"] = _check_timed_outputs(context, payload, driven)
    clean = None
    if protocol.guards:
        clean_outcome, clean_driven = _driven(context, "reference_timing", {**payload, "submission_source": ""},
                                              budget_s=max(0.5, protocol.timing_budget_s / 2),
                                              target=protocol.ci_half_width, check=False)
        clean = None if clean_outcome.died else {**clean_outcome.result, "rounds": clean_driven.rounds}
    _look_at_gpu(context, "after")
    margin = _noise_margin(context, clean, margin_cache)
    timing = {"interleaved": record, "clean_reference": clean, "noise_margin": margin,
              "device": context.options.device, "mode_requested": context.options.timing_mode}
    return decide_timing(dataclasses.replace(verdict, timing=timing), protocol)


def _driven(context: _Context, job: str, payload: dict, *, budget_s: float, target: float, check: bool = True):
    """A timing worker whose rounds this process commands (kbverify.timing_control)."""
    outcome, driven = timing_control.run(job, payload, timeout_s=context.options.timeout_s,
                                         device=context.options.device, env=context.env,
                                         keep_dir=context.options.keep_workdirs, budget_s=budget_s,
                                         target_half_width=target, check=check,
                                         distributions=payload.get("timed_distributions") or ("x1",),
                                         hang=context.hang(),
                                         kinds=_kinds(context))
    _note_child(context, job, outcome)
    return _unclaimed(outcome), driven


def timed_distributions(sets, protocol: Protocol) -> list[str]:
    """The distributions the timed rounds draw in turn: the protocol's, each where the task's own shapes had a
    valid set (a distribution on which the reference itself goes non-finite, a KL divergence on negated inputs,
    is invalid for the task: timing on it would compare NaN with NaN). x1 when none is known."""
    valid = {s.distribution for s in sets if s.valid and s.shape == "original"}
    return [d for d in protocol.distributions if d in valid] or ["x1"]


def _kinds(context: _Context) -> tuple:
    """Both kinds of batch on a GPU. A CPU has no hold, so there the two kinds are one measurement: only the device
    kind runs (the rounds a budget buys stay as many), unless a mode is asked for, which runs both (tests)."""
    if context.options.device.startswith("cuda") or context.options.timing_mode != "auto":
        return timing_control.KINDS
    return ("device",)


def _check_timed_outputs(context: _Context, payload: dict, driven) -> dict:
    """The revealed timed outputs against the reference, in a worker without submission code."""
    if not driven.checks:
        return {"checked": 0, "mismatches": [], "n_mismatches": 0, "wrong_structure": [], "n_wrong_structure": 0}
    checked = _run(context, "timing_check", {**payload, "submission_source": "", "checks": driven.checks})
    if checked.died:
        raise InfrastructureError("the timed outputs could not be checked: the checking worker died "
                                  f"({(checked.output_tail or checked.output_head).strip()[-300:]})")
    return checked.result


def _reference_fails_alone(context: _Context, payload: dict) -> bool:
    outcome, driven = _driven(context, "reference_timing", {**payload, "submission_source": ""},
                              budget_s=0.5, target=1.0, check=False)
    return outcome.died or bool((outcome.result or {}).get("error")) or not driven.rounds


def _noise_margin(context: _Context, clean: dict | None, margin_cache) -> float:
    key = f"aa-margin|{context.task.sha256}|{provenance_module.compat_key(provenance_module.collect(context.options.device))}"
    if margin_cache is not None:
        cached = margin_cache.get(key)
        if cached is not None:
            return float(cached)
    if clean is None or not clean.get("rounds"):
        return stats.DEFAULT_NOISE_MARGIN
    rounds = [(r["ref_ms"], r["cand_ms"]) for r in clean["rounds"]]
    margin = float(stats.noise_margin_from_aa(rounds))
    if margin_cache is not None:
        margin_cache.put(key, margin)
    return margin
