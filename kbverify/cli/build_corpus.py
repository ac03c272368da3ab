"""`kbverify build SOURCE`: every native extension of a corpus compiled into the content-hashed build cache ahead of
its evaluation, so that `check` and `rescore` find each one built (a cache hit costs a process start and a ninja
that finds nothing to do) and the GPU machine's clock is not spent on compilers.

A corpus is what `rescore` reads (a KernelBench run folder with `--tasks`, a CUDA-L1 or generic JSONL) or a folder
of submission files (`*.py`, each built against `--task` if given, else by running its module level alone). The
builds are `kbverify.rescore.builds.prebuild`'s, the same children the pipeline runs, sharing every core of this machine
(`builds.build_plan` with nothing evaluating beside them).

The cache is keyed by the submission's content, but torch's loader decides a hit by ninja: an extension built here
is a hit on another machine only where the loader writes the same commands there (the same torch and Python at
the same paths, the same compilers, the same TORCH_CUDA_ARCH_LIST: set it to the GPU's, e.g. `9.0` for an H100, on
a machine without one, and the same KBVERIFY_CACHE folder, since the commands name the sources by absolute path),
and where torch's headers there are no newer than the objects (ninja compares their times).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kbverify.core.errors import InputError, InfrastructureError
from kbverify.core.progress import Progress
from kbverify.rescore.importers import Entry

log = logging.getLogger(__name__)

# What became of one submission's native builds. `unreached`: no extension was asked for when its module (and,
# given its task, ModelNew and a forward) ran here: one built only on its device (a CUDA kernel on a CPU host).
KINDS = ("built", "cached", "failed", "unreached")


@dataclass(frozen=True)
class BuildOutcome:
    entry_id: str
    kind: str  # one of KINDS
    message: str = ""  # a failure's error, or why nothing was built
    cuda: bool = False  # CUDA sources: nvcc builds it, whatever the device


@dataclass(frozen=True)
class BuildSummary:
    outcomes: tuple[BuildOutcome, ...]
    without_native: int  # entries with no native sources: nothing to build
    wall_s: float
    parallel_builds: int
    max_jobs: int
    cores: int  # this machine's
    cpu_s: float  # the builds' own CPU seconds (each child and the compilers it waited for)

    @property
    def cores_used(self) -> float:
        """The builds' mean parallelism: their CPU seconds over the wall time."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def count(self, kind: str) -> int:
        return sum(outcome.kind == kind for outcome in self.outcomes)

    def to_json(self) -> dict:
        return {**{kind: self.count(kind) for kind in KINDS}, "without_native": self.without_native,
                "seconds": round(self.wall_s, 1), "parallel_builds": self.parallel_builds, "max_jobs": self.max_jobs,
                "cores": self.cores, "cpu_s": round(self.cpu_s, 1), "cores_used": round(self.cores_used, 2),
                "outcomes": [dataclasses.asdict(outcome) for outcome in self.outcomes]}


def corpus_entries(source: Path, *, fmt: str = "auto", tasks: Path | None = None, task: Path | None = None,
                   limit: int | None = None) -> list[Entry]:
    """The corpus's entries: a folder of submissions (no `--tasks`), else what `rescore` would read."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: give a number of entries, at least 1")
    if Path(source).is_dir() and tasks is None and fmt == "auto":
        entries = _folder_entries(Path(source), task)
    else:
        if task is not None:
            raise InputError("--task is for a folder of submissions; a run names its tasks (--tasks for a folder)")
        from kbverify.rescore.importers import read_source

        entries = read_source(source, fmt=fmt, tasks_dir=tasks).entries
    entries = entries[:limit] if limit is not None else entries
    if not entries:
        raise InputError(f"{source}: no entries to build")
    return entries


def _folder_entries(folder: Path, task_path: Path | None) -> list[Entry]:
    from kbverify.core.submissions import load_submission
    from kbverify.core.tasks import load_task

    paths = sorted(folder.glob("*.py"))
    if not paths:
        raise InputError(f"{folder}: no submission files (*.py) in this folder")
    task = load_task(task_path) if task_path is not None else None
    return [Entry(entry_id=path.name, task=task, submission=load_submission(path), level=None, problem_id=None,
                  sample=0, claimed_speedup=None, unverifiable=None, reference_origin="folder",
                  modified_reference=None) for path in paths]


def build_corpus(entries: list[Entry], options, *, progress: Callable[[Progress], None] | None = None,
                 plan=None) -> BuildSummary:
    """Build every native submission of `entries` (`builds.prebuild`) and say what became of each."""
    from kbverify.judge.static import scan
    from kbverify.rescore.builds import default_build_plan, needs_build, prebuild

    plan = plan or default_build_plan(0)
    started = time.monotonic()
    results = prebuild(entries, options, progress=progress, plan=plan)
    wall_s = time.monotonic() - started
    outcomes, seen, without = [], set(), 0
    for entry in entries:
        if entry.submission is None:
            continue
        syntax = scan(entry.submission.source).syntax_error
        if syntax is not None:
            outcomes.append(BuildOutcome(entry.entry_id, "failed", f"syntax error: {syntax}"))
        elif not needs_build(entry):
            without += 1
        elif entry.submission.sha256 not in seen:  # one build per content: a copy is the same extension
            seen.add(entry.submission.sha256)
            outcomes.append(outcome_of(entry, results[entry.submission.sha256], options.device))
    cpu_s = sum(result.get("cpu_s") or 0.0 for result in results.values())
    return BuildSummary(tuple(outcomes), without, wall_s, plan.parallel_builds, plan.max_jobs,
                        os.cpu_count() or 1, cpu_s)


def outcome_of(entry: Entry, result: dict, device: str) -> BuildOutcome:
    """One build child's result (`builds.build_submission`) as an outcome. The extension watch decides, not
    whether the child's run ended well: a submission that catches its failed build and falls back on PyTorch
    ends well, and a CUDA kernel run on a CPU host raises after its extension was built."""
    watched = result.get("extensions") or {}
    errors = watched.get("errors") or []
    cuda = "cuda_sources" in entry.submission.source or ".cu" in entry.submission.source
    if errors:
        return BuildOutcome(entry.entry_id, "failed", errors[-1], cuda)
    if watched.get("built"):
        return BuildOutcome(entry.entry_id, "built" if result.get("compiled") else "cached", cuda=cuda)
    error = result.get("error") or ""
    if not result.get("ok") and (not watched or not _runs_elsewhere(entry, device)):
        return BuildOutcome(entry.entry_id, "failed", error or "the build child failed", cuda)
    why = f"it raised before asking for one: {error}" if error else "its run here asked for none"
    return BuildOutcome(entry.entry_id, "unreached", f"no extension built on {device}: {why}", cuda)


def _runs_elsewhere(entry: Entry, device: str) -> bool:
    """A CUDA submission built on a CPU: what it does before its build may need the GPU it was written for."""
    return not device.startswith("cuda") and "cuda" in entry.submission.source.lower()


def require_toolchain(summary: BuildSummary, device: str) -> None:
    """A failure that reads like the machine's (no compiler, the compiler killed, the disk full) is believed only
    when a trivial extension fails too (`kbverify.harness.toolchain`): then the machine cannot build, exit 3."""
    from kbverify.harness.toolchain import cannot_build_here
    from kbverify.judge.static import classify_build_error

    suspects = [o for o in summary.outcomes if o.kind == "failed" and classify_build_error(o.message) == "toolchain"]
    if not suspects:
        return
    # a CUDA build's failure is checked with a trivial CUDA extension (built by nvcc, no GPU needed)
    reason = cannot_build_here("cuda" if any(o.cuda for o in suspects) else device)
    if reason is not None:
        raise InfrastructureError(f"this machine cannot build native extensions: {reason}")


def exit_code(summary: BuildSummary) -> int:
    """0 every build made or found in the cache; 1 a submission's build failed (docs/cli.md)."""
    return 1 if summary.count("failed") else 0


def render(summary: BuildSummary) -> str:
    lines = [f"failed  {o.entry_id}: {_first_lines(o.message)}" for o in summary.outcomes if o.kind == "failed"]
    lines += [f"unreached  {o.entry_id}: {_first_lines(o.message)}" for o in summary.outcomes
              if o.kind == "unreached"]
    lines.append(f"{summary.count('built')} built, {summary.count('cached')} cached, {summary.count('failed')} "
                 f"failed, {summary.count('unreached')} unreached ({summary.without_native} without native code) "
                 f"in {summary.wall_s:.0f} s: {summary.parallel_builds} builds at a time, MAX_JOBS={summary.max_jobs}, "
                 f"{summary.cores_used:.1f} of {summary.cores} cores used")
    return "\n".join(lines) + "\n"


# a compiler's or linker's line that says why: gcc `file.cpp:4:56: error: ...`, nvcc `file.cu(12): error: ...`,
# ld `/usr/bin/ld: cannot find -lcudart`; torch's own first line only names the extension
_WHY = re.compile(r"(:\d+: |\): )(fatal )?error|\bld: ", re.IGNORECASE)


def _first_lines(message: str, limit: int = 300) -> str:
    """A build error's line that says why (`_WHY`), else the message's start."""
    for line in message.splitlines():
        if _WHY.search(line) and len(line) < 2000:
            return line.strip()[:limit]
    return " ".join(message.split())[:limit]


def run_build(source: Path, *, fmt: str, tasks: Path | None, task: Path | None, device: str, limit: int | None,
              progress: Callable[[Progress], None] | None = None) -> BuildSummary:
    """The command, end to end: read the corpus (bad input fails first), build it, believe a toolchain failure
    only when a trivial extension fails too."""
    from kbverify.cli.jobs import resolve_device
    from kbverify.harness.runner import CheckOptions

    entries = corpus_entries(source, fmt=fmt, tasks=tasks, task=task, limit=limit)
    device = resolve_device(device)
    summary = build_corpus(entries, CheckOptions(device=device), progress=progress)
    log.info("build of %s: %s", source, render(summary).splitlines()[-1])
    require_toolchain(summary, device)
    return summary
