"""Input validation: every option and file of a command, checked before any work starts (SPEC §7, §10).

The command line calls one function per command with the values it parsed. Each returns the inputs in the form
the library takes (a frozen request) or raises InputError with one line that names the option or file and says
what is accepted, so bad input ends with exit 2 before a worker starts, a store is opened or a file is written.
What can only be judged once the source is read (does the tasks folder fit it, does the store hold another
version of the run) is checked in `kbverify.rescore.task_match` and `kbverify.results.store`, still before any work.

Nothing here imports torch, runs task or submission code, or writes anything. Two exceptions, on purpose:
`check --only hidden:...` on a task without a committed manifest asks a worker for its generated shapes, which
the check would generate anyway (and then reuses); and a folder an output goes into (or the nearest one of its
ancestors that exists) is probed by making and removing one empty folder in it, because permission bits say
nothing about `/proc`, `/sys` or a read-only mount, where the command would otherwise fail only when it writes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.core.protocols import Protocol, parse_protocols
from kbverify.core.submissions import Submission, load_submission
from kbverify.core.tasks import Task, load_task, load_task_dir
from kbverify.cli.validate_paths import (existing, folder, folder_to_write, output_file, readable,  # noqa: F401
                                     report_folder)

# A worker must start, load the task and build inputs within this; a shorter limit times out honest kernels.
MIN_TIMEOUT_S = 1.0
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_SECRET = re.compile(r"^[0-9a-fA-F]{16}$")  # what a verdict's reproducer carries (kbverify.core.inputs.new_run_secret)
SAMPLE_RULES = ("first", "best")
_BUNDLED_HIDDEN = Path(__file__).resolve().parents[2] / "hidden_tests"


@dataclass(frozen=True)
class CheckRequest:
    task: Task
    submissions: tuple[Submission, ...]
    protocols: tuple[Protocol, ...]
    device: str  # auto | cpu | cuda | cuda:N, as given (auto is resolved by a worker, after validation)
    hidden_dirs: tuple[Path, ...]
    only: str | None
    min_speedup: float | None
    secret: str | None
    timeout_s: float


@dataclass(frozen=True)
class RescoreRequest:
    source: Path
    fmt: str
    tasks: Path | None
    store: Path
    protocols: str  # the spec as given: it parses (checked here), and the job parses it again
    samples: str
    report_dir: Path | None
    device: str
    hidden_dirs: tuple[Path, ...]
    timeout_s: float
    limit: int | None
    select: Path | None
    allow_mixed: bool
    exclude_path: Path | None
    group_by: str | None = None
    executor: str = "local"
    ray_address: str | None = None
    share_gpu: int = 1


@dataclass(frozen=True)
class ScoreRequest:
    source: Path
    baseline: Path | None
    level: int | None
    ps: tuple[float, ...]
    exclude_path: Path | None
    samples: str | None
    group_by: str | None = None


# --- commands -------------------------------------------------------------------------------------------------------

def check(*, submission: Path, task: Path, protocol: str, device: str, hidden_tests: Path | None, only: str | None,
          min_speedup: float | None, secret: str | None, timeout: float) -> CheckRequest:
    sandbox_settings()
    readable(submission, "the submission")
    readable(task, "--task")
    protocols = tuple(protocol_list(protocol))
    timeout_s = seconds(timeout, "--timeout")
    device = device_name(device)
    if min_speedup is not None:
        min_speedup = non_negative(min_speedup, "--min-speedup")
    if secret is not None:
        secret = run_secret(secret)
    loaded_task = load_task(task)
    submissions = _submissions(submission)
    hidden_dirs = hidden_folders(hidden_tests)
    only = input_sets(only, protocols, loaded_task, hidden_dirs)
    return CheckRequest(task=loaded_task, submissions=submissions, protocols=protocols, device=device,
                        hidden_dirs=hidden_dirs, only=only, min_speedup=min_speedup, secret=secret,
                        timeout_s=timeout_s)


def rescore(*, source: Path, fmt: str, tasks: Path | None, store: Path, protocol: str, samples: str,
            report_dir: Path | None, device: str, hidden_tests: Path | None, timeout: float, limit: int | None,
            select: Path | None, allow_mixed: bool, exclude_degenerate: Path | None,
            group_by: str | None = None, executor: str = "local", ray_address: str | None = None,
            share_gpu: int = 1) -> RescoreRequest:
    from kbverify.rescore.importers import FORMATS

    sandbox_settings()
    existing(source, "the source", "a run folder or a JSONL file")
    for path, option in ((tasks, "--tasks"), (store, "--store"), (report_dir, "--report"), (hidden_tests,
                                                                                          "--hidden-tests"),
                         (select, "--select"), (exclude_degenerate, "--exclude-degenerate")):
        readable(path, option)
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if tasks is not None:
        folder(tasks, "--tasks")
    output_file(store, "--store")
    protocol_list(protocol)
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: give a number of entries, at least 1")
    for path, option in ((select, "--select"), (exclude_degenerate, "--exclude-degenerate")):
        if path is not None:
            existing(path, option, "a JSON file", file=True)
    if report_dir is not None:
        report_folder(report_dir, "--report")
    return RescoreRequest(source=source, fmt=fmt, tasks=tasks, store=store, protocols=protocol,
                          samples=sample_rule(samples), report_dir=report_dir, device=device_name(device),
                          hidden_dirs=hidden_folders(hidden_tests), timeout_s=seconds(timeout, "--timeout"),
                          limit=limit, select=select, allow_mixed=allow_mixed, exclude_path=exclude_degenerate,
                          group_by=group_field(group_by), executor=executor_name(executor, ray_address),
                          ray_address=ray_address, share_gpu=shared_units(share_gpu, executor))


def score(*, source: Path, baseline: Path | None, level: int | None, p: str, exclude_degenerate: Path | None,
          samples: str | None, group_by: str | None = None) -> ScoreRequest:
    existing(source, "the source", "a store, a score JSONL or an eval_results.json", file=True)
    readable(exclude_degenerate, "--exclude-degenerate")
    if baseline is not None:
        existing(baseline, "--baseline", "KernelBench's baseline-time JSON", file=True)
        if level is None:
            raise InputError("--baseline needs --level (KernelBench's eval_results.json holds one level)")
        if group_by is not None:
            raise InputError("--group-by reads a store or a score JSONL; KernelBench's eval_results.json has no "
                             "fields to group by")
    elif level is not None:
        raise InputError("--level goes with --baseline (it names the level of a KernelBench eval_results.json)")
    if level is not None and level < 1:
        raise InputError(f"--level {level}: KernelBench levels are 1, 2, 3, 4")
    if exclude_degenerate is not None:
        existing(exclude_degenerate, "--exclude-degenerate", "an audit JSON", file=True)
    return ScoreRequest(source=source, baseline=baseline, level=level, ps=p_values(p),
                        exclude_path=exclude_degenerate, samples=None if samples is None else sample_rule(samples),
                        group_by=group_field(group_by))


def audit(*, tasks: Path, protocol: str, out: Path | None, device: str, hidden_tests: Path | None) -> None:
    sandbox_settings()
    existing(tasks, "the tasks", "a task file or folder")
    readable(out, "--out")
    readable(hidden_tests, "--hidden-tests")
    load_task_dir(tasks)
    protocol_list(protocol)
    device_name(device)
    hidden_folders(hidden_tests)
    if out is not None:
        for suffix in (".json", ".md", ".partial.jsonl"):
            output_file(Path(f"{out}{suffix}"), "--out")


def audit_values(*, levels: str | None, seeds: int | None, timeout: float | None, gpus: int | None,
                 per_gpu: int | None, memory_budget_gib: float | None, memory_factor: float | None,
                 retry_per_gpu: int | None, footprints: Path | None, peaks: Path | None, shard: str | None,
                 claims: Path | None) -> None:
    """The options of an audit beyond one audit of a folder, checked before a worker starts (`kbverify.audit.options`
    checks how they go together)."""
    if levels is not None:
        parts = [part.strip() for part in levels.split(",")]
        if not all(part.isdigit() and part.isascii() and int(part) >= 1 for part in parts):
            raise InputError(f"--levels {levels!r}: give level numbers, e.g. 1,2,3")
    for value, option, least in ((seeds, "--seeds", 1), (gpus, "--gpus", 1), (per_gpu, "--per-gpu", 1),
                                 (retry_per_gpu, "--retry-per-gpu", 0)):
        if value is not None and value < least:
            raise InputError(f"{option} {value}: give a whole number, at least {least}")
    if timeout is not None:
        seconds(timeout, "--timeout")
    for value, option in ((memory_budget_gib, "--memory-budget-gib"), (memory_factor, "--memory-factor")):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise InputError(f"{option} {value:g}: give a finite number above 0")
    if shard is not None and not re.fullmatch(r"[0-9]+/[0-9]+", shard):
        raise InputError(f"--shard {shard!r}: K/N, this copy's number and the copies' count")
    for path, option in ((footprints, "--footprints"), (peaks, "--peaks")):
        if path is not None:
            output_file(path, option)
    if claims is not None:
        folder(claims, "--claims")


def compare(*, a: Path, b: Path, protocol: str) -> None:
    """`compare A B --protocol P`: for two stores, P must be a preset or name verdicts one of them holds (an unknown
    name would compare nothing and exit 1, which says a comparison found no kernel, not that it was asked for the
    wrong thing). A preset neither store holds is a comparison of nothing: exit 1, as for any two such runs."""
    for path, what in ((a, "A"), (b, "B")):
        existing(path, what, "a store or an audit report", file=True)
    if not protocol.strip():
        raise InputError("--protocol: give the name of the protocol whose verdicts to compare, e.g. verified")
    if not (_is_store(a) and _is_store(b)):
        return  # two audit reports (or a mismatch, which the comparison names): --protocol is not used
    from kbverify.core.protocols import PRESETS
    from kbverify.results.store import Store

    if protocol in PRESETS:
        return
    held: set[str] = set()
    for path in (a, b):
        with Store(path, existing=True) as store:
            held |= {verdict.protocol for _, verdict in store.verdicts()}
    if protocol not in held:
        have = ", ".join(sorted(held)) or "no verdicts"
        raise InputError(f"--protocol {protocol}: no protocol of that name; {a} and {b} hold verdicts under {have}")


def _is_store(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror}") from None


def run_secret(secret: str) -> str:
    """`--secret`: the 16 hex digits a verdict's reproducer gives. Anything else would silently draw other inputs,
    which may pass where the reproduced set failed."""
    if not _SECRET.match(secret):
        raise InputError(f"--secret {secret!r}: a secret is 16 hex digits (copy it from a verdict's reproducer, "
                         f"e.g. --secret cdcd3481e7edb9a7)")
    return secret.lower()


def report(*, store: Path, out: Path, group_by: str | None = None) -> str | None:
    existing(store, "the store", "a store written by rescore", file=True)
    report_folder(out, "--out")
    return group_field(group_by)


def protocol_list(spec: str) -> list[Protocol]:
    """`--protocol`: presets and protocol files, each file first looked up as a path (a name too long for the
    file system, or a loop above it, is named here rather than raised by the lookup)."""
    from kbverify.core.protocols import PRESETS

    for part in (part.strip() for part in spec.split(",")):
        if part and part not in PRESETS:
            readable(Path(part), "--protocol")
    return parse_protocols(spec)


def hang_floor(value: float) -> float:
    if not (value >= 0 and value == value and value != float("inf")):
        raise InputError(f"--hang-floor {value}: seconds, 0 or more")
    return value


def clock(value: str) -> str:
    from kbverify.timing.clocks import CLOCKS

    if value not in CLOCKS:
        raise InputError(f"--clock {value}: one of {', '.join(CLOCKS)}")
    return value


def rejudge(*, store: Path, protocol: str, into: Path | None) -> None:
    existing(store, "the store", "a store written by rescore", file=True)
    readable(into, "--into")
    if len(protocol_list(protocol)) != 1:
        raise InputError("--protocol: rejudge takes one protocol")
    if into is not None:
        if into.exists() or into.is_symlink():
            raise InputError(f"--into {into}: exists; rejudge writes a new store")
        output_file(into, "--into")


def demo(*, out: Path) -> None:
    readable(out, "--out")
    folder_to_write(out, "--out")
    report_folder(out / "report", "--out")
    output_file(out / "store.sqlite", "--out")


def hidden_generate(*, tasks: Path, out: Path) -> None:
    existing(tasks, "the tasks", "a task file or folder")
    readable(out, "--out")
    load_task_dir(tasks)
    folder_to_write(out, "--out")


# --- options --------------------------------------------------------------------------------------------------------

def sandbox_settings() -> None:
    """The environment the sandbox reads when it starts a worker (kbverify.harness.confine)."""
    from kbverify.harness import confine

    try:
        confine.tmpfs_size()
    except ValueError as error:
        raise InputError(str(error)) from None


def seconds(value: float, option: str) -> float:
    if not math.isfinite(value) or value < MIN_TIMEOUT_S:
        raise InputError(f"{option} {value:g}: give seconds per worker process, at least {MIN_TIMEOUT_S:g} "
                         f"(a worker needs that long to start; a shorter limit would time out honest kernels)")
    return float(value)


def non_negative(value: float, option: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{option} {value:g}: give a finite number, 0 or more")
    return float(value)


def device_name(device: str) -> str:
    if not _DEVICE.match(device):
        raise InputError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")
    return device


EXECUTORS = ("local", "ray")
# Units side by side on one device: each holds a candidate and a judge process with their CUDA contexts and
# tensors, so a few pay (the GPU idles in process starts and loads) and many only queue behind the timing phases.
MAX_SHARE_GPU = 8


def shared_units(share: int, executor: str) -> int:
    """`--share-gpu N`: 1 (the default) evaluates one unit at a time per device; more run that many units'
    correctness side by side, each timing alone. The local executor's: a Ray task asks for a whole GPU."""
    if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= MAX_SHARE_GPU:
        raise InputError(f"--share-gpu {share}: give the units evaluated side by side per device, 1 to "
                         f"{MAX_SHARE_GPU}")
    if share > 1 and executor != "local":
        raise InputError("--share-gpu goes with --executor local (a Ray task asks for a whole GPU)")
    return share


def executor_name(executor: str, ray_address: str | None) -> str:
    """`--executor local|ray`; ray must be importable (an optional extra), and `--ray-address` goes with it."""
    if executor not in EXECUTORS:
        raise InputError(f"--executor {executor!r}: use local or ray")
    if ray_address is not None and executor != "ray":
        raise InputError("--ray-address goes with --executor ray")
    if ray_address is not None and not ray_address.strip():
        raise InputError("--ray-address: give the cluster's address, e.g. ray://head:10001 or auto")
    if executor == "ray":
        from kbverify.rescore.ray_executor import require_ray

        require_ray()
    return executor


def group_field(field: str | None) -> str | None:
    """`--group-by`: a label's name as the generic JSONL spells it (whether any entry has it is checked once the
    source or store is read, still before any work)."""
    from kbverify.core.labels import FIELD

    if field is None:
        return None
    if not FIELD.match(field):
        raise InputError(f"--group-by {field!r}: give the name of a field of the JSONL's rows, e.g. model")
    from kbverify.rescore.importers import JSONL_KEYS

    if field in JSONL_KEYS or field in ("correct", "speedup", "speedup_ci_low"):
        raise InputError(f"--group-by {field}: {field} is one of the format's own keys, not a label; group by an "
                         f"extra field of the rows (e.g. model)")
    return field


def sample_rule(samples: str) -> str:
    if samples not in SAMPLE_RULES:
        raise InputError(f"--samples {samples!r}: use first or best")
    return samples


def p_values(text: str) -> tuple[float, ...]:
    """`0,0.5,1` → (0.0, 0.5, 1.0): speedup thresholds, finite, 0 or more, each once."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"--p takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise InputError("--p: give at least one speedup threshold, e.g. 0,1,2")
    bad = [value for value in values if not math.isfinite(value) or value < 0]
    if bad:
        raise InputError(f"--p {text}: {bad[0]:g} is not a speedup threshold (finite, 0 or more)")
    if len(set(values)) != len(values):
        raise InputError(f"--p {text}: a threshold is given twice")
    return values


def hidden_folders(given: Path | None) -> tuple[Path, ...]:
    """The hidden-shape manifests to use: the folder given, else the bundled ones (when present)."""
    if given is not None:
        folder(given, "--hidden-tests")
        return (given,)
    return (_BUNDLED_HIDDEN,) if _BUNDLED_HIDDEN.is_dir() else ()


def input_sets(only: str | None, protocols, task: Task, hidden_dirs) -> str | None:
    """`--only`: a set id or prefix that selects at least one input set of every isolated protocol."""
    if only is None:
        return None
    if not only.strip():
        raise InputError("--only: give an input set id or prefix, e.g. original/neg")
    isolated = [protocol for protocol in protocols if protocol.isolated]
    if not isolated:
        raise InputError(f"--only selects input sets of an isolated protocol (kbv, verified); "
                         f"{', '.join(p.name for p in protocols)} runs KernelBench's trials")
    for protocol in isolated:
        ids = _set_ids(protocol, task, hidden_dirs, hidden=_could_be_hidden(only))
        if not any(set_id.startswith(only) for set_id in ids):
            raise InputError(f"--only {only!r} matches no input set of {protocol.name} for {task.name} "
                             f"(its sets are named like {ids[0]}, {ids[-1]}; a failing verdict's reproducer "
                             f"names its set)")
    return only


def _could_be_hidden(only: str) -> bool:
    return only.startswith("hidden:") or "hidden:".startswith(only)


def _set_ids(protocol: Protocol, task: Task, hidden_dirs, *, hidden: bool) -> list[str]:
    from kbverify.core.inputs import plan_input_sets

    shapes: list[tuple[str, dict]] = [("original", {})]
    if hidden and protocol.hidden_shapes:
        from kbverify.shapes import hidden as hidden_module

        committed = hidden_module.committed_shapes(task, list(hidden_dirs))
        if committed is None:
            from kbverify.harness.input_plan import hidden_shapes_for

            committed, _ = hidden_shapes_for(task, list(hidden_dirs))
        shapes += [(shape.label, {}) for shape in committed]
    return [input_set.set_id for input_set in plan_input_sets(protocol, shapes, secret="validation")]


# --- files ------------------------------------------------------------------------------------------------------------

def _submissions(submission: Path) -> tuple[Submission, ...]:
    if submission.is_dir():
        paths = sorted(submission.glob("*.py"))
        if not paths:
            raise InputError(f"{submission}: no submission files (*.py) in this folder")
        return tuple(load_submission(path) for path in paths)
    return (load_submission(submission),)
