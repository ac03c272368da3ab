"""`kbverify audit`: find tasks whose reference makes a score meaningless before they inflate one (SPEC §6).

One sandboxed child per task (`kbverify.child.audit_worker`) runs the reference over seeds × distributions × both
weight regimes (× hidden shapes) and returns raw numbers; this module applies the thresholds, so thresholds
are data, written into every report, and a partial file can be re-judged under other thresholds.

Flags (codes are stable; evidence and the threshold used are recorded with each):
  constant_output                 output identical (within constant_atol + constant_rtol·max|out|) across every
                                  seed and distribution of one weight regime, default or re-randomised
  near_zero:<protocol>            returning zeros passes the protocol's own check on all its sets
  trivially_passable:<k>:<p>      null kernel k passes protocol p: ones, input (the input itself, where a
                                  single output has an input's shape), other_seed (another seed's output),
                                  other_seed_mean (that output's mean everywhere), bf16, fp16 (the reference
                                  computed in that precision). The TF32 reference is no null kernel: the
                                  verified rule accepts a candidate as accurate as its TF32 baseline by design.
  uniform_axis                    some axis (size > 1) of an output has no variation on any set of a regime
  mostly_zero / mostly_mean       > 70% of elements within atol of 0 / of the output's mean, on every set the
                                  task draws itself (x1, default weights, its own shapes) — METR's rules
  dead_input / dead_parameter     perturbing it leaves the output unchanged (zero-gradient candidates from one
                                  backward pass, confirmed by perturbation on several seeds)
  stochastic                      two runs with the same seeds, reseeded before each call, disagree
  nonfinite:<distribution>        the reference raises or goes non-finite there: that distribution is invalid
                                  for the task (recorded under invalid_distributions, never held against kernels)
  timing_degenerate               GPU only: reference median below timing_min_us, where launch overhead dominates

Which flags make a task degenerate (excluded), per protocol p:
  - always: constant_output, stochastic, and nonfinite on the task's own inputs (x1, default weights, its own
    shapes) — no honest comparison is possible there;
  - under p: near_zero:p, and trivially_passable:{ones, other_seed, other_seed_mean}:p — kernels that ignore
    their input pass, so the task measures nothing under p;
  - under p: the input itself passes p's rule on *every* audited distribution (an identity in substance, like a
    1×1 max-pool). Passing only p's own sets (ReLU on `torch.rand` inputs under original) is what the
    distributions exist to catch, so it is reported, not excluded.
Only reported: uniform_axis, mostly_zero, mostly_mean (heuristics; the null kernels decide), dead_input,
dead_parameter (a bias before a training-mode BatchNorm is an algebraic simplification, not a degenerate task),
nonfinite on other distributions, trivially_passable via bf16/fp16 (a tolerance matter), timing_degenerate.
A task is `degenerate` when it is degenerate under any audited protocol; `exclusions_by_protocol` keeps the
finer answer.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kbverify import __version__
from kbverify.correctness import judge_set
from kbverify.errors import InputError
from kbverify.inputs import KERNELBENCH_SEED, kernelbench_trial_seeds
from kbverify.protocols import ALL_DISTRIBUTIONS, Protocol, get_protocol
from kbverify.sandbox import run_child, start_early
from kbverify.tasks import Task, load_task_dir

log = logging.getLogger(__name__)

FORMAT = "kbverify-audit/1"
NEAR_ATOLS = (1e-2, 1e-3)  # the worker counts elements within these of 0 and of the mean
NULL_KERNELS = ("zeros", "ones", "input", "other_seed", "other_seed_mean", "bf16", "fp16")
INPUT_INDEPENDENT_KERNELS = ("ones", "other_seed", "other_seed_mean")  # plus zeros, reported as near_zero
ALWAYS_DEGENERATE = ("constant_output", "stochastic", "nonfinite:own_inputs")
DEFERRED_WAIT_S = 0.5  # how long an auditor whose every remaining task is deferred waits before asking again
REPORTED_ONLY = ("uniform_axis", "mostly_zero", "mostly_mean", "dead_input", "dead_parameter",
                 "nonfinite:<distribution>", "trivially_passable:bf16|fp16:<protocol>", "timing_degenerate")


@dataclass(frozen=True)
class AuditThresholds:
    """Applied by the parent to the worker's raw numbers; written into every report."""

    constant_atol: float = 1e-6  # spread across sets ≤ atol + rtol·max|out| → constant
    constant_rtol: float = 1e-5
    uniform_axis_atol: float = 1e-7  # largest max−min along the axis ≤ atol + rtol·max|out| → uniform
    uniform_axis_rtol: float = 1e-6
    mostly_atol: float = 1e-2  # METR: atol of its correctness check
    mostly_fraction: float = 0.7
    mostly_mean_min_numel: int = 101  # METR: the near-mean rule only for more than 100 elements
    stochastic_norm_rel: float = 1e-4  # ‖run₂ − run₁‖/‖run₁‖ above this → stochastic (far above GPU atomics)
    dead_norm_rel: float = 1e-5  # ‖Δout‖/‖out‖ at or below this after a full-scale perturbation → dead
    timing_min_us: float = 20.0  # eager launch + dispatch is ~5–10 µs per op: below 20 µs it dominates

    def __post_init__(self):
        if self.mostly_atol not in NEAR_ATOLS:
            raise InputError(f"mostly_atol must be one of {', '.join(map(repr, NEAR_ATOLS))}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AuditSettings:
    """What the worker runs. Changing any of these invalidates resumed results (they are keyed by its hash)."""

    seeds: int = 3  # input seeds at the task's own shapes (KernelBench's trial seeds, from 42)
    hidden_seeds: int = 1  # seeds per hidden shape
    hidden_shapes: bool = True
    hidden_dirs: tuple[str, ...] = ()  # committed manifests; tasks without one get shapes generated by the rule
    distributions: tuple[str, ...] = ALL_DISTRIBUTIONS
    null_kernels: tuple[str, ...] = NULL_KERNELS
    low_precision_seeds: int = 1  # input seeds per (shape, distribution, weights) the bf16/fp16 null kernels run on
    weight_seed: int = KERNELBENCH_SEED
    dead_candidate_sensitivity: float = 1e-4  # gradient estimate below this → confirm by perturbation
    max_perturbations: int = 64
    perturbation_seeds: int = 2
    timing_calls: int = 50
    timing_warmup_calls: int = 5
    # The reference's timing stops once more than half the planned calls took this long or longer: the median of
    # all of them could then be no lower, so any timing_min_us up to this one is decided exactly (a 10 ms reference
    # needs 26 calls, not 50). Shorter references, where the flag is in question, always get every call.
    timing_decided_us: float = 1000.0
    timeout_s: float = 900.0  # per task, wall clock

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def worker_dict(self) -> dict:
        data = self.to_dict()
        data.pop("timeout_s")
        data["input_seeds"] = kernelbench_trial_seeds(self.seeds)
        data["hidden_dirs"] = [str(d) for d in self.hidden_dirs]
        return data


@dataclass(frozen=True)
class TaskAudit:
    task: str  # "level2/80_Gemm_Max_Subtract_GELU" (the name alone when the level is unknown)
    key: str  # level/name@sha256 prefix (Task.key)
    name: str
    level: int | None
    sha256: str
    flags: tuple[str, ...]
    degenerate: bool
    degenerate_under: tuple[str, ...]
    evidence: dict
    invalid_distributions: dict  # distribution → [{"set_id", "reason"}]
    hidden_shapes: str  # committed | generated | none | off | unavailable | error
    error: str | None
    wall_s: float
    resumed: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AuditReport:
    tasks: tuple[TaskAudit, ...]
    protocols: tuple[str, ...]
    thresholds: AuditThresholds
    settings: AuditSettings
    device: str
    wall_s: float
    title: str = "audit"
    provenance: dict = field(default_factory=dict)

    @property
    def exclusions(self) -> list[str]:
        return sorted(t.task for t in self.tasks if t.degenerate)

    @property
    def exclusions_by_protocol(self) -> dict[str, list[str]]:
        return {p: sorted(t.task for t in self.tasks if p in t.degenerate_under) for p in self.protocols}

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "title": self.title, "kbverify_version": __version__, "device": self.device,
            "provenance": self.provenance, "protocols": list(self.protocols), "settings": self.settings.to_dict(),
            "thresholds": self.thresholds.to_dict(),
            "policy": {"degenerate_always": list(ALWAYS_DEGENERATE),
                       "degenerate_under_protocol": ["near_zero:<p>"] + [f"trivially_passable:{k}:<p>"
                                                                        for k in INPUT_INDEPENDENT_KERNELS]
                       + ["input passes <p>'s rule on every audited distribution"],
                       "reported_only": list(REPORTED_ONLY)},
            "counts": {"tasks": len(self.tasks), "degenerate": sum(t.degenerate for t in self.tasks),
                       "errors": sum(t.error is not None for t in self.tasks),
                       "resumed": sum(t.resumed for t in self.tasks)},
            "wall_s": self.wall_s,
            "exclusions": self.exclusions, "exclusions_by_protocol": self.exclusions_by_protocol,
            "tasks": [t.to_dict() for t in self.tasks],
        }


# ---- protocols as the audit sees them ----------------------------------------------------------------------

def covers(protocol: Protocol, shape: str, distribution: str, weights: str) -> bool:
    """Whether an input set belongs to the sets `protocol` evaluates a kernel on."""
    return (distribution in protocol.distributions
            and (weights == "default" or protocol.rerandomized_weights)
            and (shape == "original" or protocol.hidden_shapes))


def protocol_from_dict(data: dict) -> Protocol:
    return Protocol(**{**data, "distributions": tuple(data["distributions"])})


def judged_protocols(kernel: str, protocol: Protocol, distributions: Sequence[str]) -> list[Protocol]:
    """The protocols null kernel `kernel` is judged by for `protocol`: the protocol itself, and for the input
    itself also its rule over every audited distribution (the identity test). The worker tracks these only."""
    return [protocol] + ([every_distribution(protocol, distributions)] if kernel == "input" else [])


def every_distribution(protocol: Protocol, distributions: Sequence[str]) -> Protocol:
    """`protocol`'s rule over every audited distribution (named "<p>*"): the identity test for degeneracy."""
    wanted = tuple(dict.fromkeys((*protocol.distributions, *distributions)))
    if set(wanted) == set(protocol.distributions):
        return protocol
    return dataclasses.replace(protocol, name=protocol.name + "*", distributions=wanted)


def _resolve(protocols: Sequence[Protocol | str]) -> list[Protocol]:
    resolved = [p if isinstance(p, Protocol) else get_protocol(p) for p in protocols]
    if not resolved:
        raise InputError("audit: no protocol given")
    return list({p.name: p for p in resolved}.values())


# ---- running ----------------------------------------------------------------------------------------------

def audit_tasks(tasks: Sequence[Task] | str | Path, *, protocols: Sequence[Protocol | str], device: str = "cpu",
                out_prefix: str | Path | None = None, resume: bool = True,
                progress: Callable[[int, int, TaskAudit], None] | None = None,
                settings: AuditSettings | None = None, thresholds: AuditThresholds | None = None,
                title: str | None = None, claim: Callable[[Task], bool | None] | None = None,
                release: Callable[[Task], None] | None = None, run: bool = True) -> AuditReport:
    """Audit every task; with `out_prefix`, append each task's raw result to `<prefix>.partial.jsonl` as it
    finishes (a rerun skips those, unless they errored) and write `<prefix>.json` and `<prefix>.md` at the end.
    With `claim`, a task not yet done is audited only when claim(task) is true (several auditors sharing one
    task list, each taking the next unclaimed task); the tasks left to others are not in the returned report.
    claim(task) None means "not now" (it does not fit in memory beside the others' tasks): the task is deferred,
    the next one in order tried, and the deferred ones asked again, first, whenever this auditor is free; when
    nothing can start it waits. `release(task)` is called when a task it claimed has ended, however it ended.
    With `run=False` nothing runs: a report of what the partial file holds, where a task without a result shows
    its last recorded error (or that it was never audited), so a cut-short audit is reported as such."""
    if isinstance(tasks, (str, Path)):
        title = title or Path(tasks).name
        tasks = load_task_dir(tasks)
    settings = settings or AuditSettings()
    thresholds = thresholds or AuditThresholds()
    if thresholds.timing_min_us > settings.timing_decided_us:
        # the worker stops timing once the median is decided up to timing_decided_us, not beyond
        raise InputError(f"timing_min_us {thresholds.timing_min_us:g} is above the {settings.timing_decided_us:g} µs "
                         "the timing flag is decided up to (AuditSettings.timing_decided_us)")
    protocols = _resolve(protocols)
    judged = _with_identity_variants(protocols, settings.distributions)
    worker_settings = settings.worker_dict()
    judged_by = _judged_by(protocols, settings)
    fingerprint = settings_fingerprint(protocols=protocols, device=device, settings=settings)
    partial = Path(f"{out_prefix}.partial.jsonl") if out_prefix is not None else None
    done = _read_partial(partial, fingerprint) if (partial is not None and resume) else {}
    failed = ({line["key"]: line for line in _partial_lines(partial) if line.get("raw") is None}
              if (partial is not None and not run) else {})
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            partial.write_text("")
    if run:
        start_early(timing=False)  # audit workers never run the interleaved timing (sandbox.TIMING_PRELOAD)
    started = time.monotonic()
    audits: list[TaskAudit] = []
    lines: list[dict] = []
    queue = list(tasks)
    index = 0
    while queue:
        picked = _next_task(queue, done, claim)
        if picked is None:  # every task left is deferred: wait for memory to free up
            time.sleep(DEFERRED_WAIT_S)
            continue
        task, verdict = picked
        queue.remove(task)
        index += 1
        if verdict == "elsewhere":
            continue
        line = done.get(task.key)
        if line is None and not run:
            line = failed.get(task.key) or {"key": task.key, "raw": None, "wall_s": 0.0,
                                            "error": "not audited: no result in the partial file"}
        elif line is None:
            line = _run_claimed(task, worker_settings, judged, device, settings.timeout_s, judged_by,
                                release if verdict == "claimed" else None)
            line["settings_sha256"] = fingerprint
            if partial is not None:
                _append_line(partial, line)
        lines.append(line)
        audit = assess(task, line, protocols=protocols, thresholds=thresholds, distributions=settings.distributions,
                       resumed=task.key in done)
        audits.append(audit)
        log.info("[%d/%d] %s%s: %s%s (%.1f s)", index, len(tasks), audit.task, " (resumed)" if audit.resumed else "",
                 "DEGENERATE " if audit.degenerate else "", ", ".join(audit.flags) or audit.error or "no flags",
                 audit.wall_s)
        if progress is not None:
            progress(index, len(tasks), audit)
    report = AuditReport(tasks=tuple(audits), protocols=tuple(p.name for p in protocols), thresholds=thresholds,
                         settings=settings, device=device, wall_s=time.monotonic() - started,
                         title=title or (Path(out_prefix).name if out_prefix is not None else "audit"),
                         provenance=_provenance(lines))
    if out_prefix is not None:
        write_report(report, out_prefix)
    return report


def _next_task(queue: list[Task], done: dict, claim) -> tuple[Task, str] | None:
    """The first task in `queue` that can be taken now, with why: "resumed", "free" (no claims), "claimed", or
    "elsewhere" (another auditor has it). None when every task left is deferred."""
    for task in queue:
        if task.key in done:
            return task, "resumed"
        if claim is None:
            return task, "free"
        verdict = claim(task)
        if verdict is not None:
            return task, "claimed" if verdict else "elsewhere"
    return None


def _run_claimed(task: Task, worker_settings: dict, judged: list[Protocol], device: str, timeout_s: float,
                 judged_by: dict, release: Callable[[Task], None] | None) -> dict:
    """Run one task, its start and end times on the line (so overlaps between auditors can be checked), and
    release its claim's reservation however it ended."""
    started = time.time()
    try:
        line = _run_task(task, worker_settings, judged, device, timeout_s, judged_by)
    finally:
        if release is not None:
            release(task)
    line["started_unix_s"], line["ended_unix_s"] = started, time.time()
    return line


def _with_identity_variants(protocols: list[Protocol], distributions: Sequence[str]) -> list[Protocol]:
    variants = {p.name: p for p in protocols}
    for p in protocols:
        variant = every_distribution(p, distributions)
        variants.setdefault(variant.name, variant)
    return list(variants.values())


def _settings_sha256(worker_settings: dict, protocols: list[Protocol], device: str) -> str:
    text = json.dumps({"settings": worker_settings, "protocols": [p.to_dict() for p in protocols],
                       "device": device.split(":")[0], "version": __version__}, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()


def _judged_by(protocols: list[Protocol], settings: AuditSettings) -> dict[str, list[str]]:
    """Null kernel → the protocols `assess` judges it by (the worker tracks no others)."""
    return {kernel: sorted({p.name for protocol in protocols
                            for p in judged_protocols(kernel, protocol, settings.distributions)})
            for kernel in settings.null_kernels}


def _payload(task: Task, worker_settings: dict, protocols: list[Protocol], device: str,
             judged_by: dict[str, list[str]] | None) -> dict:
    return {"task_source": task.source, "task_name": task.name, "device": device,
            "settings": worker_settings, "protocols": [p.to_dict() for p in protocols],
            "committed_shapes": _committed_shapes(task, worker_settings), "null_kernel_protocols": judged_by}


def worker_payload(task: Task, *, protocols: Sequence[Protocol | str], settings: AuditSettings,
                   device: str) -> dict:
    """What the audit worker is given for `task`, as `audit_tasks` gives it (for tools that run the worker
    in their own process)."""
    protocols = _resolve(protocols)
    return _payload(task, settings.worker_dict(), _with_identity_variants(protocols, settings.distributions),
                    device, _judged_by(protocols, settings))


def _run_task(task: Task, worker_settings: dict, protocols: list[Protocol], device: str,
              timeout_s: float, judged_by: dict[str, list[str]] | None = None) -> dict:
    payload = _payload(task, worker_settings, protocols, device, judged_by)
    outcome = run_child("audit", payload, timeout_s=timeout_s, device=device)
    line = {"key": task.key, "name": task.name, "level": task.level, "sha256": task.sha256, "path": task.path,
            "wall_s": outcome.wall_s, "raw": None, "error": None}
    if outcome.timed_out:
        line["error"] = f"timeout after {timeout_s:g} s (last phase: {outcome.last_phase or 'start'})"
    elif outcome.result is None:
        output = (outcome.output_tail or outcome.output_head).strip()[-400:]
        line["error"] = (f"worker died (exit code {outcome.exit_code}, last phase: {outcome.last_phase or 'start'})"
                         + (f": {output}" if output else ""))
    elif "infrastructure_error" in outcome.result:
        line["error"] = f"worker failed: {outcome.result['infrastructure_error']}"
    else:
        line["raw"] = outcome.result
    return line


def _committed_shapes(task: Task, worker_settings: dict) -> list[dict] | None:
    """Manifests are read here, by the parent: the worker runs in a directory of its own, where the paths given
    on the command line (often relative) mean nothing. None: no manifest, the worker generates shapes."""
    if not worker_settings.get("hidden_shapes"):
        return None
    from kbverify import hidden

    try:
        shapes = hidden.committed_shapes(task, worker_settings.get("hidden_dirs", []))
    except InputError as error:  # one broken manifest must not stop an audit of 250 tasks
        log.warning("%s: %s; its hidden shapes are generated instead", task.name, error)
        return None
    return None if shapes is None else [shape.to_json() for shape in shapes]


def _provenance(lines: list[dict]) -> dict:
    raws = [line["raw"] for line in lines if line.get("raw")]
    return {"created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": sorted({r.get("torch", "") for r in raws}),
            "gpu": sorted({r["gpu"] for r in raws if r.get("gpu")})}


# ---- the partial file -------------------------------------------------------------------------------------

def settings_fingerprint(*, protocols: Sequence[Protocol | str], device: str,
                         settings: AuditSettings | None = None) -> str:
    """What a partial file's lines must carry to be resumed by an audit with these settings."""
    settings = settings or AuditSettings()
    judged = _with_identity_variants(_resolve(protocols), settings.distributions)
    return _settings_sha256(settings.worker_dict(), judged, device)


def finished_keys(paths: Sequence[Path], *, protocols: Sequence[Protocol | str], device: str,
                  settings: AuditSettings | None = None) -> set[str]:
    """Keys of the tasks some partial file among `paths` already holds a result for, under these settings."""
    fingerprint = settings_fingerprint(protocols=protocols, device=device, settings=settings)
    return {key for path in paths for key in _read_partial(Path(path), fingerprint)}


def merge_partials(target: Path, sources: Sequence[Path], fingerprint: str | None = None) -> int:
    """Merge partial files into `target`, one line per task, written atomically; the sources are removed once the
    merge is on disk. Returns the number of lines. A line of these settings (`fingerprint`) beats one of others, a
    result beats an error, and between equals the later wins."""
    best: dict[str, tuple[tuple[bool, bool], dict]] = {}
    for path in [target, *sources]:
        for line in _partial_lines(Path(path)):
            rank = (fingerprint is None or line.get("settings_sha256") == fingerprint, line.get("raw") is not None)
            if line["key"] not in best or rank >= best[line["key"]][0]:
                best[line["key"]] = (rank, line)
    _write_atomically(Path(target), "".join(json.dumps(line, default=_json_default, allow_nan=True) + "\n"
                                            for _, line in best.values()))
    for path in sources:
        Path(path).unlink(missing_ok=True)
    return len(best)


def _read_partial(path: Path | None, fingerprint: str) -> dict[str, dict]:
    """Finished tasks by key. A line cut short by a kill, one from other settings, or one that errored is
    ignored (the task runs again)."""
    if path is None:
        return {}
    return {line["key"]: line for line in _partial_lines(path)
            if line.get("settings_sha256") == fingerprint and line.get("raw") is not None}


def _partial_lines(path: Path):
    """Every whole line of a partial file that names its task; a line cut short by a kill is skipped."""
    if not path.exists():
        return
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and "key" in line:
            yield line


def _append_line(path: Path, line: dict) -> None:
    data = json.dumps(line, default=_json_default, allow_nan=True) + "\n"
    with open(path, "ab+") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":  # a line cut short by a kill: end it so ours parses
                handle.write(b"\n")
        handle.write(data.encode())
        handle.flush()
        os.fsync(handle.fileno())


def _json_default(value):
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


# ---- judging one task's raw numbers -------------------------------------------------------------------------

def task_identifier(name: str, level: int | None) -> str:
    return f"level{level}/{name}" if level is not None else name


def assess(task: Task, line: dict, *, protocols: Sequence[Protocol], thresholds: AuditThresholds,
           distributions: Sequence[str] = ALL_DISTRIBUTIONS, resumed: bool = False) -> TaskAudit:
    """Flags, evidence and the degeneracy decision for one task from its worker's raw numbers."""
    identity = task_identifier(task.name, task.level)
    base = dict(task=identity, key=task.key, name=task.name, level=task.level, sha256=task.sha256,
                wall_s=float(line.get("wall_s") or 0.0), resumed=resumed)
    raw = line.get("raw")
    if raw is None:
        return TaskAudit(**base, flags=(), degenerate=False, degenerate_under=(), evidence={},
                         invalid_distributions={}, hidden_shapes="none", error=line.get("error") or "no result")
    hidden = raw.get("hidden", {}).get("origin", "none")
    sets = {s["set_id"]: s for s in raw["sets"]}
    valid = {k: s for k, s in sets.items() if s["valid"]}
    if not valid:
        reasons = sorted({s.get("invalid_reason", "") for s in sets.values()} | {e["error"] for e in raw["errors"]})
        return TaskAudit(**base, flags=(), degenerate=False, degenerate_under=(), evidence={"worker_errors":
                         raw["errors"]}, invalid_distributions={}, hidden_shapes=hidden,
                         error="the reference gave no valid output: " + "; ".join(r for r in reasons if r)[:600])
    found = _Findings()
    invalid = _nonfinite(sets, found)
    _constant(raw, found, thresholds)
    _null_kernels(raw, valid, protocols, distributions, found)
    _uniform_axis(valid, found, thresholds)
    _mostly(valid, found, thresholds)
    _stochastic(raw, found, thresholds)
    _dead(raw, found, thresholds)
    _timing(raw, found, thresholds)
    evidence = dict(found.evidence)
    evidence["sets"] = {"valid": len(valid), "invalid": len(sets) - len(valid)}
    if raw.get("tf32"):
        evidence["tf32_baseline"] = {"sets": len(raw["tf32"]), "max_norm_rel": max(
            (part.get("norm_rel", 0.0) for s in raw["tf32"].values() for part in s.get("outputs", [])), default=0.0)}
    if raw["errors"]:
        evidence["worker_errors"] = raw["errors"]
    evidence["phase_s"] = raw.get("phase_s", {})
    under = _degenerate_under(found, protocols, distributions)
    return TaskAudit(**base, flags=tuple(found.flags), degenerate=bool(under), degenerate_under=tuple(under),
                     evidence=evidence, invalid_distributions=invalid, hidden_shapes=hidden, error=None)


class _Findings:
    def __init__(self):
        self.flags: list[str] = []
        self.evidence: dict = {}
        self.intrinsic = False  # degenerate whatever the protocol
        self.passes: dict[tuple[str, str], bool] = {}  # (null kernel, protocol name) → passes

    def flag(self, code: str, evidence: dict, *, intrinsic: bool = False) -> None:
        if code not in self.flags:
            self.flags.append(code)
        self.evidence[code] = evidence
        self.intrinsic |= intrinsic


def _nonfinite(sets: dict, found: _Findings) -> dict:
    invalid: dict[str, list] = {}
    for s in sets.values():
        if not s["valid"]:
            invalid.setdefault(s["distribution"], []).append({"set_id": s["set_id"], "reason": s["invalid_reason"]})
    for distribution, entries in invalid.items():
        # only a non-finite output on the task's own inputs makes it uncheckable; raising there (out of
        # memory on a smaller GPU, say) says nothing about the task
        own = distribution == "x1" and any(
            sets[e["set_id"]]["shape"] == "original" and sets[e["set_id"]]["weights"] == "default"
            and "non-finite" in e["reason"] for e in entries)
        found.flag(f"nonfinite:{distribution}", {"invalid_sets": len(entries), "example": entries[0],
                                                 "own_inputs": own}, intrinsic=own)
    return invalid


def _constant(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    constant = []
    for family in raw["families"]:
        if family["compared"] < 1:
            continue
        limit = t.constant_atol + t.constant_rtol * family["max_abs"]
        if family["max_abs_spread"] <= limit:
            constant.append({"shape": family["shape"], "weights": family["weights"], "sets": family["compared"] + 1,
                             "max_abs_spread": family["max_abs_spread"], "max_abs": family["max_abs"],
                             "limit": limit})
    if constant:
        found.flag("constant_output", {"families": constant}, intrinsic=True)


def _null_kernels(raw: dict, valid: dict, protocols: Sequence[Protocol], distributions: Sequence[str],
                  found: _Findings) -> None:
    tf32 = raw.get("tf32", {})
    for name, result in raw.get("null_kernels", {}).items():
        for protocol in protocols:
            for variant in judged_protocols(name, protocol, distributions):
                passes, detail = _passes(result, valid, tf32, variant)
                found.passes[(name, variant.name)] = passes
                if not passes or variant is not protocol:
                    continue
                code = f"near_zero:{protocol.name}" if name == "zeros" else f"trivially_passable:{name}:{protocol.name}"
                found.flag(code, detail)


def _passes(result: dict, valid: dict, tf32: dict, protocol: Protocol) -> tuple[bool, dict]:
    if result.get("error"):
        return False, {}
    checks = [c for c in result["checks"] if c["set_id"] in valid
              and covers(protocol, valid[c["set_id"]]["shape"], valid[c["set_id"]]["distribution"],
                         valid[c["set_id"]]["weights"])]
    if not checks:
        return False, {}
    worst_norm, max_ref = 0.0, 0.0
    for check in checks:
        if "screened" in check:
            # The worker retired the kernel on this set from a sample alone, because every protocol still alive
            # for it certainly rejects it there (correctness.certainly_rejects); the others had failed before.
            return False, {}
        outcome, _, _ = judge_set(check["summary"], tf32.get(check["set_id"]), protocol)
        if outcome != "passed":
            return False, {}
        for part in check["summary"].get("outputs", []):
            worst_norm = max(worst_norm, part.get("norm_rel", 0.0))
            max_ref = max(max_ref, part.get("ref_max_abs", 0.0))
    return True, {"sets_checked": len(checks), "worst_norm_rel": worst_norm, "max_abs_reference": max_ref,
                  "rule": protocol.rule, "atol": protocol.atol, "rtol": protocol.rtol}


def _uniform_axis(valid: dict, found: _Findings, t: AuditThresholds) -> None:
    verdicts: dict[tuple, dict] = {}  # (weights, output, axis) → running evidence
    for s in valid.values():
        for index, stats in enumerate(s["outputs"]):
            for axis, span in enumerate(stats.get("axis_range") or []):
                if span is None:
                    continue
                key = (s["weights"], index, axis)
                entry = verdicts.setdefault(key, {"weights": s["weights"], "output": index, "axis": axis,
                                                  "uniform": True, "max_range": 0.0, "sets": 0})
                entry["sets"] += 1
                entry["max_range"] = max(entry["max_range"], span)
                entry["uniform"] &= span <= t.uniform_axis_atol + t.uniform_axis_rtol * stats["max_abs"]
    uniform = [{k: v for k, v in e.items() if k != "uniform"} for e in verdicts.values() if e["uniform"]]
    if uniform:
        found.flag("uniform_axis", {"axes": uniform})


def read_by_mostly(input_set: dict) -> bool:
    """The sets the mostly-zero and mostly-mean rules read: the task's own shape, default weights, x1 inputs. The
    worker takes the fractions those rules need on these sets alone."""
    return (input_set["shape"] == "original" and input_set["weights"] == "default"
            and input_set["distribution"] == "x1")


def _mostly(valid: dict, found: _Findings, t: AuditThresholds) -> None:
    own = [s for s in valid.values() if read_by_mostly(s)]
    if not own:
        return
    key = repr(t.mostly_atol)
    for code, stat, min_numel in (("mostly_zero", "frac_near_zero", 1), ("mostly_mean", "frac_near_mean",
                                                                          t.mostly_mean_min_numel)):
        fractions = []
        for s in own:
            parts = [o for o in s["outputs"] if stat in o and o["numel"] >= min_numel]
            total = sum(o["numel"] for o in parts)
            if total:
                fractions.append(sum(o[stat][key] * o["numel"] for o in parts) / total)
        if fractions and len(fractions) == len(own) and min(fractions) > t.mostly_fraction:
            found.flag(code, {"min_fraction": min(fractions), "sets": len(fractions), "atol": float(key),
                              "fraction_limit": t.mostly_fraction})


def _stochastic(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    runs = raw.get("stochastic", [])
    bad = [r for r in runs if not _within(r["diff_norm"], r["ref_norm"], t.stochastic_norm_rel)]
    if bad:
        worst = max(bad, key=lambda r: _relative(r["diff_norm"], r["ref_norm"]))
        found.flag("stochastic", {"sets": [r["set_id"] for r in bad], "worst_norm_rel":
                                  _relative(worst["diff_norm"], worst["ref_norm"]),
                                  "max_abs_diff": worst["max_abs_diff"], "limit": t.stochastic_norm_rel},
                   intrinsic=True)


def _within(diff_norm: float, ref_norm: float, rel: float) -> bool:
    return math.isfinite(diff_norm) and diff_norm <= rel * ref_norm


def _relative(diff_norm: float, ref_norm: float) -> float:
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def _dead(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    dead = raw.get("dead")
    if not dead:
        return
    sensitivity = {(i["kind"], i["name"]): i["sensitivity"] for i in dead["inputs"] + dead["parameters"]}
    by_kind: dict[str, list] = {"input": [], "parameter": []}
    for entry in dead["perturbed"]:
        runs = [r for r in entry["runs"] if "diff_norm" in r]
        if runs and all(_within(r["diff_norm"], r["ref_norm"], t.dead_norm_rel) for r in runs):
            by_kind[entry["kind"]].append({
                "name": entry["name"], "gradient_sensitivity": sensitivity.get((entry["kind"], entry["name"])),
                "max_norm_rel": max(_relative(r["diff_norm"], r["ref_norm"]) for r in runs), "seeds": len(runs)})
    for kind, items in by_kind.items():
        if items:
            found.flag(f"dead_{kind}", {f"{kind}s": items, "limit": t.dead_norm_rel,
                                        "gradient_error": dead.get("gradient_error", "")})


def _timing(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    timing = raw.get("timing")
    if timing and timing["reference_median_us"] < t.timing_min_us:
        found.flag("timing_degenerate", {"reference_median_us": timing["reference_median_us"],
                                         "launch_floor_median_us": timing["launch_floor_median_us"],
                                         "limit_us": t.timing_min_us})
    elif timing:
        found.evidence["timing"] = {"reference_median_us": timing["reference_median_us"],
                                    "launch_floor_median_us": timing["launch_floor_median_us"]}


def _degenerate_under(found: _Findings, protocols: Sequence[Protocol], distributions: Sequence[str]) -> list[str]:
    under = []
    for protocol in protocols:
        name = protocol.name
        identity = every_distribution(protocol, distributions).name
        if (found.intrinsic or found.passes.get(("zeros", name))
                or any(found.passes.get((k, name)) for k in INPUT_INDEPENDENT_KERNELS)
                or found.passes.get(("input", identity))):
            under.append(name)
    return under


# ---- reports ----------------------------------------------------------------------------------------------

def write_report(report: AuditReport, out_prefix: str | Path) -> tuple[Path, Path]:
    """`<prefix>.json` (complete, machine-readable) and `<prefix>.md` (a table), each written atomically."""
    json_path, md_path = Path(f"{out_prefix}.json"), Path(f"{out_prefix}.md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(json_path, json.dumps(_json_safe(report.to_dict()), indent=1) + "\n")
    _write_atomically(md_path, render_markdown(report))
    return json_path, md_path


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _json_safe(value):
    """Strict JSON: infinities and NaN become strings, so any reader can load the report."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def render_markdown(report: AuditReport) -> str:
    counts = report.to_dict()["counts"]
    lines = [f"# Degenerate-task audit: {report.title}", "",
             f"{counts['tasks']} tasks, **{counts['degenerate']} degenerate**, {counts['errors']} errors "
             f"({counts['resumed']} resumed). Device `{report.device}`, protocols {', '.join(report.protocols)}, "
             f"{report.settings.seeds} seeds × {len(report.settings.distributions)} distributions × 2 weight regimes"
             f"{' (+ hidden shapes)' if report.settings.hidden_shapes else ''}; {report.wall_s:.0f} s this run, "
             f"{sum(a.wall_s for a in report.tasks):.0f} s of worker time in all.", "",
             "Low-precision passes (the reference in bf16/fp16 passing a protocol) are a tolerance matter, listed in "
             "their own column.", "",
             "| task | degenerate | flags | evidence | low precision passes |", "|---|---|---|---|---|"]
    for audit in report.tasks:
        if audit.error is not None:
            lines.append(f"| {audit.task} | error | | {_cell(audit.error)} | |")
            continue
        verdict = f"**yes** ({', '.join(audit.degenerate_under)})" if audit.degenerate else "no"
        main = [f for f in audit.flags if not f.startswith(_LOW_PRECISION_FLAGS)]
        flags = ", ".join(f"`{f}`" for f in main)
        evidence = _cell("; ".join(_describe(code, audit.evidence.get(code, {})) for code in main))
        lines.append(f"| {audit.task} | {verdict} | {flags} | {evidence} | {_low_precision(audit.flags)} |")
    lines += ["", "## Exclusions", ""]
    lines += [f"- `{name}`" for name in report.exclusions] or ["(none)"]
    for protocol, names in report.exclusions_by_protocol.items():
        lines.append(f"\nUnder `{protocol}`: {', '.join(f'`{n}`' for n in names) or 'none'}.")
    invalid = [(a.task, d, len(e)) for a in report.tasks for d, e in a.invalid_distributions.items()]
    if invalid:
        lines += ["", "## Invalid distributions (the reference raised or went non-finite)", "",
                  "| task | distribution | sets |", "|---|---|---|"]
        lines += [f"| {task} | {distribution} | {n} |" for task, distribution, n in invalid]
    lines += ["", "## Thresholds", "", "| threshold | value |", "|---|---|"]
    lines += [f"| {k} | {v:g} |" for k, v in report.thresholds.to_dict().items()]
    lines += ["", "## What excludes a task", "",
              "- always: " + ", ".join(f"`{c}`" for c in ALWAYS_DEGENERATE),
              "- under a protocol p: `near_zero:p`, " + ", ".join(f"`trivially_passable:{k}:p`"
                                                                 for k in INPUT_INDEPENDENT_KERNELS)
              + ", and the input itself passing p's rule on every audited distribution",
              "- reported only: " + ", ".join(f"`{c}`" for c in REPORTED_ONLY), ""]
    return "\n".join(lines)


_LOW_PRECISION_FLAGS = ("trivially_passable:bf16:", "trivially_passable:fp16:")


def _low_precision(flags: Sequence[str]) -> str:
    passes: dict[str, list[str]] = {}
    for flag in flags:
        if flag.startswith(_LOW_PRECISION_FLAGS):
            _, dtype, protocol = flag.split(":")
            passes.setdefault(dtype, []).append(protocol)
    return "; ".join(f"{dtype}: {', '.join(protocols)}" for dtype, protocols in passes.items())


def _cell(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(code: str, e: dict) -> str:
    """One short phrase of evidence per flag, for the table."""
    if code == "constant_output":
        f = e["families"][0]
        return (f"constant ({f['weights']} weights): spread {f['max_abs_spread']:.2g} over {f['sets']} sets, "
                f"max|out| {f['max_abs']:.2g}")
    if code.startswith("near_zero:") or code.startswith("trivially_passable:"):
        what = "zeros" if code.startswith("near_zero:") else code.split(":")[1]
        return (f"{what} pass {code.rsplit(':', 1)[1]} on {e['sets_checked']} sets "
                f"(max|ref| {e['max_abs_reference']:.2g})")
    if code == "uniform_axis":
        return "uniform along " + ", ".join(f"axis {a['axis']} of output {a['output']} ({a['weights']})"
                                            for a in e["axes"][:3])
    if code in ("mostly_zero", "mostly_mean"):
        return f"{code.replace('_', ' ')}: ≥{e['min_fraction']:.0%} within {e['atol']:g}"
    if code in ("dead_input", "dead_parameter"):
        items = e.get("inputs", e.get("parameters", []))
        return "dead: " + ", ".join(f"{i['name']} (Δ {i['max_norm_rel']:.1g})" for i in items[:4])
    if code == "stochastic":
        return f"two reseeded runs differ by {e['worst_norm_rel']:.2g} (norm-wise)"
    if code.startswith("nonfinite:"):
        return f"{code.split(':')[1]}: {e['invalid_sets']} invalid set(s): {e['example']['reason']}"
    if code == "timing_degenerate":
        return f"reference {e['reference_median_us']:.1f} µs (launch floor {e['launch_floor_median_us']:.1f} µs)"
    return ""


def audit_to_json_summary(report: AuditReport) -> dict:
    """What `kbverify audit --json` prints (SPEC §10), plus the exclusion lists."""
    tasks = []
    for audit in report.tasks:
        entry = {"task": audit.task, "degenerate": audit.degenerate, "flags": list(audit.flags),
                 "evidence": {code: audit.evidence[code] for code in audit.flags if code in audit.evidence},
                 "degenerate_under": list(audit.degenerate_under)}
        if audit.error is not None:
            entry["error"] = audit.error
        tasks.append(entry)
    return _json_safe({"tasks": tasks, "exclusions": report.exclusions,
                       "exclusions_by_protocol": report.exclusions_by_protocol,
                       "thresholds": report.thresholds.to_dict()})


def load_exclusions(audit_json_path: str | Path, *, protocol: str | None = None) -> set[str]:
    """Task identifiers to exclude: each excluded task as "levelL/NAME" and as its bare file name "NAME".

    With `protocol`, only the tasks degenerate under that protocol (it must have been audited)."""
    path = Path(audit_json_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read audit: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not a kbverify audit (expected format {FORMAT})")
    by_protocol = data.get("exclusions_by_protocol")
    if protocol is None:
        names = data.get("exclusions")
    elif isinstance(by_protocol, dict) and protocol in by_protocol:
        names = by_protocol[protocol]
    else:
        raise InputError(f"{path}: protocol {protocol!r} was not audited "
                         f"(audited: {', '.join(map(str, data.get('protocols', [])))})")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InputError(f"{path}: its exclusions are not a list of task names")
    return {form for name in names for form in (name, name.rsplit("/", 1)[-1])}
