"""Native builds of a corpus, keyed by content hash: how they share the cores (`BuildPlan`), one submission's build
in a child (`build_submission`), and all of a corpus's ahead of evaluation (`prebuild`, what `kbverify build` and
the benchmarks run). The rescore pipeline (`kbverify.rescore.rescore.LocalExecutor`) runs the same builds beside its
evaluation.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from kbverify.core.progress import Progress
from kbverify.harness import toolchain
from kbverify.harness.runner import CheckOptions, build_env
from kbverify.harness.sandbox import run_child
from kbverify.judge.static import scan
from kbverify.rescore.importers import Entry

BUILD_TIMEOUT_S = 900.0
# Compiler processes per build. A load_inline extension is two translation units (the bindings' main.cpp and
# cuda.cu) and a link, so a third job is never used; two let the pair compile side by side.
JOBS_PER_BUILD = 2
# Builds at a time per free core. A build keeps its MAX_JOBS cores busy only while both units compile: the bindings
# finish long before nvcc's serial stages (cudafe++, cicc, ptxas, the host compile), and the link and the child's
# own Python (its start, the module, ModelNew and a forward) run alone. So one build per free core, where
# cores // MAX_JOBS (six builds on a 16-core host under --share-gpu 4) left cores idle (issue 37). Measured on a
# 2-core CPU with four CUDA-L1 kernels (torch 2.14.1+cu130, nvcc 13.0): one build at a time kept 0.83 cores
# busy, and two at a time built 1.65x as many a minute.
BUILDS_PER_CORE = 1


@dataclass(frozen=True)
class BuildPlan:
    """How native builds share the CPU cores: `parallel_builds` at a time, `max_jobs` (MAX_JOBS) compiler
    processes each."""

    parallel_builds: int
    max_jobs: int


def build_plan(cores: int, evaluators: int, max_jobs: int | None = None) -> BuildPlan:
    """Each evaluating thread keeps a core (its unit's parent and worker processes run beside the builds); the
    rest go to builds, BUILDS_PER_CORE each, JOBS_PER_BUILD compiler processes each unless MAX_JOBS says otherwise.
    With more jobs per build than the default, builds at a time shrink so that their jobs fit the free cores."""
    free = max(1, cores - evaluators)
    jobs = max(1, min(max_jobs or JOBS_PER_BUILD, free))
    per_build = max(1, jobs // JOBS_PER_BUILD)  # cores one build keeps busy on average
    return BuildPlan(parallel_builds=max(1, BUILDS_PER_CORE * free // per_build), max_jobs=jobs)


def default_build_plan(evaluators: int) -> BuildPlan:
    given = os.environ.get("MAX_JOBS")
    return build_plan(os.cpu_count() or 1, evaluators, int(given) if given and given.isdigit() else None)


def needs_build(entry: Entry) -> bool:
    """A submission with native sources; its task is optional (`kbverify build` of a folder without one runs the
    module level alone, where most extensions are built)."""
    return bool(entry.submission and scan(entry.submission.source).native_sources)


def build_submission(entry: Entry, options: CheckOptions) -> dict:
    """Run one native submission's module level in a child (and, given its task, ModelNew and one forward), so
    that its evaluation finds the build cached (or its failure remembered). A build that outlasts BUILD_TIMEOUT_S
    is killed there. `compiled`: whether a compiler wrote an extension now; False with an extension built is a
    cache hit (ninja found every object up to date). `cpu_s`: the child's and its compilers' CPU seconds."""
    submission, task = entry.submission, entry.task
    payload = {"submission_source": submission.source, "device": options.device}
    if task is not None:
        payload.update(task_source=task.source, task_name=task.name)
    env = build_env(submission, options)
    before = toolchain.built_extensions(env)
    outcome = run_child("build", payload, timeout_s=BUILD_TIMEOUT_S, device=options.device, env=env)
    result = outcome.result or {"ok": False, "error": "build timed out" if outcome.timed_out
                                else f"build process died (exit {outcome.exit_code})"}
    return {**result, "compiled": toolchain.built_extensions(env) != before}


def prebuild(entries: list[Entry], options: CheckOptions, *, workers: int | None = None,
             progress: Callable[[Progress], None] | None = None, plan: BuildPlan | None = None) -> dict[str, dict]:
    """Build every native submission of `entries` now (the pipeline's builds, without the evaluation), `plan`
    sharing the cores (default: every core, nothing evaluating beside), `workers`, if given, the builds at a time.
    Progress goes to `progress` as the "build" phase. Returns each build's result (`build_submission`) by content
    hash."""
    unique = {}
    for entry in entries:
        if needs_build(entry):
            unique.setdefault(entry.submission.sha256, entry)
    plan = plan or default_build_plan(0)
    if workers:
        plan = dataclasses.replace(plan, parallel_builds=workers)
    options = dataclasses.replace(options, max_jobs=options.max_jobs or plan.max_jobs)
    report = _build_reporter(progress, len(unique), plan.parallel_builds)
    built: dict[str, dict] = {}
    report(0, "")
    with ThreadPoolExecutor(max_workers=plan.parallel_builds, thread_name_prefix="kbverify-build") as pool:
        futures = {pool.submit(build_submission, entry, options): sha256 for sha256, entry in unique.items()}
        for done, future in enumerate(as_completed(futures), start=1):
            sha256 = futures[future]
            built[sha256] = future.result()
            report(done, f"{unique[sha256].entry_id} {_said(built[sha256])}")
    return built


def _said(result: dict) -> str:
    """A build's word in the progress line, from the extension watch: a run that raised after its extension was
    built (a CUDA kernel's forward on a CPU) still built it."""
    watched = result.get("extensions") or {}
    if watched.get("errors") or not watched:
        return "failed"
    if watched.get("built"):
        return "built" if result.get("compiled") else "cached"
    return "no extension asked for"


def _build_reporter(progress: Callable[[Progress], None] | None, total: int, workers: int):
    started = time.monotonic()

    def report(done: int, last: str) -> None:
        if progress is not None:
            spent = time.monotonic() - started
            progress(Progress(done, total, eta_s=spent / done * (total - done) if done else None, last=last,
                              phase="build", device="cpu", workers=workers))
    return report
