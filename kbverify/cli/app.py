"""The command line (SPEC §10). It parses and calls; the library does the work and logs.

Exit codes: 0 the job completed (for `check`: every verdict passed), 1 a submission was rejected, 2 bad input,
3 infrastructure failure.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from kbverify.core.errors import KbverifyError
from kbverify.harness import hang as hang_module

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="kbverify: is this kernel really correct, and really faster, and how sure are we?")
hidden_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Hidden-shape manifests.")
app.add_typer(hidden_app, name="hidden")

DEFAULT_P = "0,0.5,1,1.5,2"
CLOCK_HELP = ("which clock the fast_p tables read: device (default: the kernel's own time, behind the device-side "
              "hold, what verified has always reported, and a clock a forward claiming to block cannot raise) or "
              "host (what a caller that waits on each call sees: launches and waits inside the call included)")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


def _start_workers(*, timing: bool) -> None:
    """The worker server, started once the input is known to be good (its torch import overlaps what follows); and
    the MPS daemons earlier commands left ended first (kbverify.harness.mps_lifetime), or each said in one line."""
    from kbverify.harness.mps_lifetime import end_stale
    from kbverify.harness.sandbox import start_early

    end_stale()
    start_early(timing=timing)


def _emit(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=None, default=str) + "\n")


@app.command()
def check(submission: Path = typer.Argument(..., help="ModelNew file, or a folder of them"),
          task: Path = typer.Option(..., "--task", help="the task file (KernelBench format)"),
          protocol: str = typer.Option("verified", "--protocol", help="original, kbv, verified, a protocol file, or a list"),
          device: str = typer.Option("auto", "--device"),
          hidden_tests: Optional[Path] = typer.Option(None, "--hidden-tests"),
          only: Optional[str] = typer.Option(None, "--only", help="rerun just this input set (a set id or prefix)"),
          min_speedup: Optional[float] = typer.Option(None, "--min-speedup"),
          secret: Optional[str] = typer.Option(None, "--secret", help="reuse a verdict's seeds (see its reproducer)"),
          timeout: float = typer.Option(600.0, "--timeout", help="seconds per worker process"),
          hang_floor: float = typer.Option(hang_module.FLOOR_S, "--hang-floor",
                                           help="seconds a forward may send no progress before it is a timeout: "
                                                "the floor of max(this, 50 x the reference's call); 0: --timeout only"),
          json_out: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
          verbose: bool = typer.Option(False, "-v", "--verbose")):
    """Verify one submission (or a folder of them) against its task."""
    _setup_logging(verbose)
    from kbverify.cli import jobs, validate
    from kbverify.core import present
    from kbverify.harness import runner

    request = validate.check(submission=submission, task=task, protocol=protocol, device=device,
                             hidden_tests=hidden_tests, only=only, min_speedup=min_speedup, secret=secret,
                             timeout=timeout)
    validate.hang_floor(hang_floor)
    _start_workers(timing=any(p.timing == "interleaved" for p in request.protocols))

    def options():  # called under the progress lines: `--device auto` asks a worker, which takes seconds
        return runner.CheckOptions(device=jobs.resolve_device(request.device), hidden_dirs=request.hidden_dirs,
                                   only=request.only, timeout_s=request.timeout_s, secret=request.secret,
                                   hang_floor_s=hang_floor)

    rejected = False
    for candidate, verdicts in _judged(request, options):
        for verdict in verdicts.values():
            reached = request.min_speedup is None or (verdict.speedup is not None
                                                      and verdict.speedup >= request.min_speedup)
            rejected |= not (verdict.correct and reached)
        if json_out:
            _emit({"task": request.task.name, "submission": candidate.id,
                   "verdicts": {name: present.verdict_json(v) for name, v in verdicts.items()}})
        else:
            sys.stdout.write(present.render_check(request.task.name, candidate.id, list(verdicts.values())))
    raise typer.Exit(1 if rejected else 0)


def _judged(request, make_options) -> list:
    """Every (submission, {protocol: verdict}) of a check, with progress on stderr (kbverify.harness.check_progress): in a
    log a line at once, then a line per step and at least every 20 s. Returned whole, so stdout is written once the
    live bar is gone. `make_options()` gives the check's options; it may take seconds (the device's probe)."""
    from kbverify.core.progress import Reporter
    from kbverify.harness import check_progress, runner, task_probe

    judged = []
    with Reporter() as reporter, check_progress.watching(
            reporter, total=len(request.submissions) * len(request.protocols), device=request.device) as watcher:
        watcher.plan([p.name for p in request.protocols], len(request.submissions))
        watcher.preparing("finding the device (--device auto)" if request.device == "auto" else "starting")
        options = make_options()
        watcher.device = options.device
        for candidate in request.submissions:
            verdicts = {}
            for p in request.protocols:
                with watcher.verdict(candidate.id, p.name):
                    verdicts[p.name] = task_probe.judge(runner.check, request.task, candidate, p, options)
                    watcher.finished(verdicts[p.name].status.value)
            judged.append((candidate, verdicts))
    return judged


@app.command()
def rescore(source: Path = typer.Argument(..., help="a KernelBench run folder, a CUDA-L1 JSONL, or a generic JSONL"),
            format: str = typer.Option("auto", "--format"),
            tasks: Optional[Path] = typer.Option(None, "--tasks", help="task folder for run folders"),
            store: Path = typer.Option(Path("kbverify-store.sqlite"), "--store"),
            protocol: str = typer.Option("original,verified", "--protocol"),
            samples: str = typer.Option("first", "--samples"),
            report_dir: Optional[Path] = typer.Option(None, "--report"),
            device: str = typer.Option("auto", "--device"),
            hidden_tests: Optional[Path] = typer.Option(None, "--hidden-tests"),
            timeout: float = typer.Option(900.0, "--timeout", help="seconds per worker process"),
            limit: Optional[int] = typer.Option(None, "--limit", help="only the first N entries"),
            select: Optional[Path] = typer.Option(None, "--select",
                                                  help="JSON subset file (kernels: [{level_id, task_id}])"),
            allow_mixed: bool = typer.Option(False, "--allow-mixed"),
            exclude_degenerate: Optional[Path] = typer.Option(
                None, "--exclude-degenerate", help="an audit JSON: its degenerate tasks leave the fast_p tables"),
            clock: str = typer.Option("device", "--clock", help=CLOCK_HELP),
            group_by: Optional[str] = typer.Option(None, "--group-by", help="a field of the JSONL's rows (e.g. model): tables per group"),
            executor: str = typer.Option("local", "--executor", help="local, or ray (units as Ray tasks, one GPU each)"),
            ray_address: Optional[str] = typer.Option(None, "--ray-address", help="the Ray cluster (default: $RAY_ADDRESS)"),
            share_gpu: int = typer.Option(1, "--share-gpu", help="units whose correctness runs side by side on one "
                                          "device (MPS on a GPU); timing always alone. 1: one unit at a time"),
            json_out: bool = typer.Option(False, "--json"),
            verbose: bool = typer.Option(False, "-v", "--verbose")):
    """Re-score a published run under several protocols; resumable through --store."""
    _setup_logging(verbose)
    from kbverify.cli import jobs, validate
    from kbverify.core.progress import Reporter

    request = validate.rescore(source=source, fmt=format, tasks=tasks, store=store, protocol=protocol,
                               samples=samples, report_dir=report_dir, device=device, hidden_tests=hidden_tests,
                               timeout=timeout, limit=limit, select=select, allow_mixed=allow_mixed,
                               exclude_degenerate=exclude_degenerate, group_by=group_by, executor=executor,
                               ray_address=ray_address, share_gpu=share_gpu)
    validate.clock(clock)
    with Reporter() as reporter:  # stderr: a live bar in a terminal, a line at least every 30 s elsewhere
        summary = jobs.run_rescore(request.source, fmt=request.fmt, tasks=request.tasks, store_path=request.store,
                                   protocols=request.protocols, samples=request.samples,
                                   report_dir=request.report_dir, device=request.device,
                                   hidden_dirs=request.hidden_dirs, timeout_s=request.timeout_s,
                                   limit=request.limit, allow_mixed=request.allow_mixed, progress=reporter,
                                   select=request.select, exclude_path=request.exclude_path,
                                   group_by=request.group_by, executor=request.executor,
                                   ray_address=request.ray_address, clock=clock, share_gpu=request.share_gpu)
    if json_out:
        _emit(summary)
    else:
        sys.stdout.write(summary["text"])
    if not summary["complete"]:
        raise typer.Exit(3)  # the job is not done: units an infrastructure error left without a verdict


@app.command()
def build(source: Path = typer.Argument(..., help="a folder of submissions, a KernelBench run folder (with --tasks), "
                                                 "a CUDA-L1 JSONL or a generic JSONL"),
          format: str = typer.Option("auto", "--format", help="as rescore's; a folder without --tasks is a folder "
                                                              "of submissions"),
          tasks: Optional[Path] = typer.Option(None, "--tasks", help="task folder for run folders"),
          task: Optional[Path] = typer.Option(None, "--task", help="the task of a folder of submissions: ModelNew "
                                              "and one forward run too (extensions built lazily)"),
          device: str = typer.Option("auto", "--device"),
          limit: Optional[int] = typer.Option(None, "--limit", help="only the first N entries"),
          json_out: bool = typer.Option(False, "--json"),
          verbose: bool = typer.Option(False, "-v", "--verbose")):
    """Compile every native extension of a corpus into the build cache, on every core, ahead of its evaluation."""
    _setup_logging(verbose)
    from kbverify.cli import build_corpus, validate
    from kbverify.core.progress import Reporter

    validate.device_name(device)
    with Reporter() as reporter:  # stderr: a live bar in a terminal, a line at least every 20 s elsewhere
        summary = build_corpus.run_build(source, fmt=format, tasks=tasks, task=task, device=device, limit=limit,
                                         progress=reporter)
    if json_out:
        _emit(summary.to_json())
    else:
        sys.stdout.write(build_corpus.render(summary))
    raise typer.Exit(build_corpus.exit_code(summary))


@app.command()
def score(source: Path = typer.Argument(..., help="a store, a score JSONL, or KernelBench's eval_results.json"),
          baseline: Optional[Path] = typer.Option(None, "--baseline", help="KernelBench baseline-time JSON"),
          level: Optional[int] = typer.Option(None, "--level", help="level of a KernelBench eval_results.json"),
          p: str = typer.Option(DEFAULT_P, "--p"),
          exclude_degenerate: Optional[Path] = typer.Option(None, "--exclude-degenerate"),
          samples: Optional[str] = typer.Option(None, "--samples", help="first or best (default: each protocol's own)"),
          clock: str = typer.Option("device", "--clock", help=CLOCK_HELP),
          group_by: Optional[str] = typer.Option(None, "--group-by", help="a field of the JSONL's rows (e.g. model): tables per group"),
          json_out: bool = typer.Option(False, "--json")):
    """fast_p from stored verdicts, a score JSONL, or KernelBench's own files."""
    _setup_logging(False)
    from kbverify.cli import jobs, validate

    request = validate.score(source=source, baseline=baseline, level=level, p=p,
                             exclude_degenerate=exclude_degenerate, samples=samples, group_by=group_by)
    validate.clock(clock)
    result = jobs.run_score(request.source, baseline=request.baseline, level=request.level, ps=request.ps,
                            exclude_path=request.exclude_path, samples=request.samples, group_by=request.group_by,
                            clock=clock)
    if json_out:
        _emit(result["json"])
    else:
        sys.stdout.write(result["text"])
    if not result["json"]["complete"]:
        raise typer.Exit(3)  # fast_p over fewer units than the runs planned


AUDIT_COPIES_HELP = {
    "levels": "only these levels, e.g. 1,2,3",
    "seeds": "input seeds at the tasks' own shapes (3)",
    "timeout": "seconds per task (900)",
    "no_hidden": "audit the tasks' own shapes only",
    "fresh": "ignore OUT.partial.jsonl",
    "gpus": "copies of the audit on this many GPUs of this host, sharing the task list (needs --out)",
    "per_gpu": "copies sharing each GPU (default: 10 on a CUDA device with --gpus, else 1); memory admission "
               "decides which run at once",
    "memory_budget_gib": "device memory the copies on one GPU may reserve in all (default: 0.85 of its total; on "
                         "a CPU, no admission without it)",
    "memory_factor": "an audit's expected peak over its tensors' bytes, for admission",
    "footprints": "a JSON cache of the tasks' footprints by content hash: read, and completed",
    "peaks": "a JSON file of recorded peak memory by content hash: used for admission, updated with this run's",
    "mps": "copies sharing a GPU run under a private CUDA MPS daemon (on by default where available)",
    "retry_per_gpu": "copies per GPU that audit again what failed among many (2)",
    "estimate_only": "fill --footprints; audit nothing",
    "report_only": "run nothing: merge the copies' partial files and report what they hold",
    "published": "compare with KernelBench's published lists",
}


@app.command()
def audit(tasks: Path = typer.Argument(..., help="a task file or folder"),
          protocol: str = typer.Option("original,kbv,verified", "--protocol"),
          out: Optional[Path] = typer.Option(None, "--out", help="write OUT.json and OUT.md"),
          device: str = typer.Option("auto", "--device"),
          hidden_tests: Optional[Path] = typer.Option(None, "--hidden-tests"),
          json_out: bool = typer.Option(False, "--json"),
          verbose: bool = typer.Option(False, "-v", "--verbose"),
          levels: Optional[str] = typer.Option(None, "--levels", help=AUDIT_COPIES_HELP["levels"]),
          seeds: Optional[int] = typer.Option(None, "--seeds", help=AUDIT_COPIES_HELP["seeds"]),
          timeout: Optional[float] = typer.Option(None, "--timeout", help=AUDIT_COPIES_HELP["timeout"]),
          no_hidden: bool = typer.Option(False, "--no-hidden", help=AUDIT_COPIES_HELP["no_hidden"]),
          fresh: bool = typer.Option(False, "--fresh", help=AUDIT_COPIES_HELP["fresh"]),
          gpus: Optional[int] = typer.Option(None, "--gpus", help=AUDIT_COPIES_HELP["gpus"]),
          per_gpu: Optional[int] = typer.Option(None, "--per-gpu", help=AUDIT_COPIES_HELP["per_gpu"]),
          memory_budget_gib: Optional[float] = typer.Option(None, "--memory-budget-gib",
                                                            help=AUDIT_COPIES_HELP["memory_budget_gib"]),
          memory_factor: Optional[float] = typer.Option(None, "--memory-factor",
                                                        help=AUDIT_COPIES_HELP["memory_factor"]),
          footprints: Optional[Path] = typer.Option(None, "--footprints", help=AUDIT_COPIES_HELP["footprints"]),
          peaks: Optional[Path] = typer.Option(None, "--peaks", help=AUDIT_COPIES_HELP["peaks"]),
          mps: Optional[bool] = typer.Option(None, "--mps/--no-mps", help=AUDIT_COPIES_HELP["mps"]),
          retry_per_gpu: Optional[int] = typer.Option(None, "--retry-per-gpu",
                                                      help=AUDIT_COPIES_HELP["retry_per_gpu"]),
          estimate_only: bool = typer.Option(False, "--estimate-only", help=AUDIT_COPIES_HELP["estimate_only"]),
          report_only: bool = typer.Option(False, "--report-only", help=AUDIT_COPIES_HELP["report_only"]),
          published: bool = typer.Option(False, "--published", help=AUDIT_COPIES_HELP["published"]),
          shard: Optional[str] = typer.Option(None, "--shard", hidden=True),  # K/N: copy K of N
          claims: Optional[Path] = typer.Option(None, "--claims", hidden=True)):  # the copies' shared claims
    """Find degenerate and trivially passable tasks."""
    _setup_logging(verbose)
    from kbverify.audit.command import run_audit_options
    from kbverify.audit.options import audit_options
    from kbverify.cli import jobs, validate
    from kbverify.core.progress import Reporter

    validate.audit(tasks=tasks, protocol=protocol, out=out, device=device, hidden_tests=hidden_tests)
    validate.audit_values(levels=levels, seeds=seeds, timeout=timeout, gpus=gpus, per_gpu=per_gpu,
                          memory_budget_gib=memory_budget_gib, memory_factor=memory_factor,
                          retry_per_gpu=retry_per_gpu, footprints=footprints, peaks=peaks, shard=shard, claims=claims)
    hidden_dirs = validate.hidden_folders(hidden_tests)
    given = dict(levels=levels, seeds=seeds, timeout_s=timeout, hidden_shapes=False if no_hidden else None,
                 fresh=fresh or None, gpus=gpus, per_gpu=per_gpu, memory_budget_gib=memory_budget_gib, mps=mps,
                 memory_factor=memory_factor, footprints=footprints, peaks=peaks, retry_per_gpu=retry_per_gpu,
                 estimate_only=estimate_only or None, report_only=report_only or None, shard=shard, claims=claims,
                 compare_published=published or None)
    common = dict(tasks=tasks, out=out, protocol=protocol, hidden_tests=hidden_tests, hidden_dirs=hidden_dirs,
                  verbose=verbose)
    # how the options go together, checked before a worker starts; then with the device the workers see
    audit_options(device=device, given=dict(given), **common)
    _start_workers(timing=False)  # audit workers never time the interleaved way
    device = jobs.resolve_device(device)
    options = audit_options(device=device, given=given, **common)
    if options is not None:
        result = run_audit_options(options)
    else:
        with Reporter() as progress:
            result = jobs.run_audit(tasks, protocols=protocol, out=out, device=device, hidden_dirs=hidden_dirs,
                                    progress=progress)
    _emit(result["json"]) if json_out and result["json"] is not None else sys.stdout.write(result["text"])


@hidden_app.command("generate")
def hidden_generate(tasks: Path = typer.Argument(...), out: Path = typer.Option(..., "--out"),
                    verbose: bool = typer.Option(False, "-v", "--verbose")):
    """Generate and validate hidden-shape manifests for a task folder."""
    _setup_logging(verbose)
    from kbverify.cli import validate
    from kbverify.shapes import hidden

    validate.hidden_generate(tasks=tasks, out=out)
    summary = hidden.generate_command(tasks, out)
    sys.stdout.write(json.dumps(summary, default=str) + "\n")


@app.command()
def report(store: Path = typer.Argument(...), out: Path = typer.Option(..., "--out"),
           group_by: Optional[str] = typer.Option(None, "--group-by", help="a field of the JSONL's rows (e.g. model): tables per group"),
           clock: str = typer.Option("device", "--clock", help=CLOCK_HELP)):
    """Write report.json, report.md and report.html from a store."""
    _setup_logging(False)
    from kbverify.cli import jobs, validate

    field = validate.report(store=store, out=out, group_by=group_by)
    validate.clock(clock)
    result = jobs.run_report(store, out, group_by=field, clock=clock)
    sys.stdout.write(result["text"])
    if not result["complete"]:
        raise typer.Exit(3)


@app.command()
def rejudge(store: Path = typer.Argument(...), protocol: str = typer.Option("verified", "--protocol"),
            json_out: bool = typer.Option(False, "--json"),
            into: Path = typer.Option(None, "--into", help="write a copy of the store with the rejudged verdicts")):
    """Recompute stored verdicts under another protocol's rules, without a GPU."""
    _setup_logging(False)
    from kbverify.cli import jobs, validate

    validate.rejudge(store=store, protocol=protocol, into=into)
    result = jobs.run_rejudge(store, protocol, into)
    if json_out:
        _emit(result["json"])
    else:
        sys.stdout.write(result["text"])


@app.command()
def compare(a: Path = typer.Argument(..., metavar="A", help="a store, or an audit report (JSON)"),
            b: Path = typer.Argument(..., metavar="B", help="the same kind as A"),
            protocol: str = typer.Option("verified", "--protocol", help="which verdicts of two stores to compare")):
    """Two stores: how far each kernel's speedup moved. Two audit reports: which tasks' verdicts changed."""
    _setup_logging(False)
    from kbverify.cli import validate
    from kbverify.results.compare import compare as compare_results

    validate.compare(a=a, b=b, protocol=protocol)
    result = compare_results(a, b, protocol=protocol)
    sys.stdout.write(result.text)
    raise typer.Exit(result.exit_code)

@app.command()
def demo(out: Path = typer.Option(Path("kbverify-demo"), "--out"),
         verbose: bool = typer.Option(False, "-v", "--verbose")):
    """Re-score the bundled example run (honest kernels and cheats) on this machine and print both fast_p tables."""
    _setup_logging(verbose)
    from kbverify.cli import jobs, validate
    from kbverify.core.progress import Reporter

    validate.demo(out=out)
    with Reporter() as progress:
        result = jobs.run_demo(out, progress=progress)
    sys.stdout.write(result["text"])
    if not result["complete"]:
        raise typer.Exit(3)


USAGE = ("usage: kbverify COMMAND [ARGS]... where COMMAND is check, rescore, build, score, audit, hidden generate, "
         "report, rejudge, compare or demo (kbverify --help, kbverify COMMAND --help)")


def main() -> None:
    """The command line proper; `kbverify.__main__` starts the worker server before importing this."""
    if sys.argv[1:] in ([], ["hidden"]):  # typer would print the help on stdout and an empty line on stderr
        sys.stderr.write(f"kbverify: {USAGE}\n")
        sys.exit(2)
    empty = _empty_argument(sys.argv[1:])
    if empty is not None:
        sys.stderr.write(f"kbverify: {_one_line(empty)}\n")
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except KbverifyError as error:
        sys.stderr.write(f"kbverify: {_one_line(str(error))}\n")
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("kbverify: interrupted; finished work is in the store\n")
        sys.exit(130)
    except Exception as error:  # usage errors from click (or the copy of it that typer bundles)
        if hasattr(error, "format_message") and hasattr(error, "exit_code"):
            sys.stderr.write(f"kbverify: {_one_line(error.format_message())}\n")
            sys.exit(2)
        if type(error).__name__ == "Abort":
            sys.exit(130)
        # A bug of kbverify's (bad input is an InputError, a failing machine an InfrastructureError): exit 3, as
        # the contract says for kbverify's own failures, never 1, which would say a submission was rejected.
        import traceback

        traceback.print_exc(file=sys.stderr)
        sys.stderr.write(f"kbverify: internal error ({type(error).__name__}: {_first_line(error)}); this is a "
                         f"bug in kbverify, please report it with the traceback above\n")
        sys.exit(3)


def _empty_argument(args: list[str]) -> str | None:
    """An empty argument is never a valid value (a path, a protocol, a name) and most often a shell variable that
    was not set: as a path it would silently mean the current folder."""
    for index, arg in enumerate(args):
        if arg == "":
            before = args[index - 1] if index and args[index - 1].startswith("-") else None
            return (f"{before}: an empty value (an unset shell variable?)" if before else
                    f"argument {index + 1} is empty (an unset shell variable?)")
        if arg.startswith("--") and arg.endswith("=") and len(arg) > 3:
            return f"{arg[:-1]}: an empty value (an unset shell variable?)"
    return None


def _one_line(message: str) -> str:
    """The contract's one line: a newline in a path or a value is shown escaped, not as a second line."""
    return message.strip().replace("\r", "\\r").replace("\n", "\\n")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else "no message"
