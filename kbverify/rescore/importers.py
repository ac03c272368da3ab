"""Importers: published runs → entries (task, submission, claimed speedup) ready to re-score.

`docs/formats.md` documents the three formats for users:
- `kernelbench`: a KernelBench run folder of `level_L_problem_P_sample_S_kernel.py`, tasks looked up in a tasks
  folder; claims from `eval_results.json` with a `baseline_time*.json`, and/or `claims.jsonl`.
- `cuda-l1`: CUDA-L1's JSON Lines (`level_id`, `task_id`, `ref_code`, `custom_code`, `score_default`); each row is
  scored against its own `ref_code`, which is checked against the known KernelBench versions.
- `jsonl`: kbverify's generic JSON Lines (`task`, `code` or `path`, optional `id`, `sample`, `claimed_speedup`,
  `ref_code`).

Bad input (an unreadable source, a bad JSON line, a missing key) raises InputError naming the file and line. A
problem with one entry (no code, its task not found, its kernel file unreadable) makes that entry `unverifiable`:
its claim is still counted. A file of a run folder that could not be used (an unreadable kernel file, a malformed
`eval_results.json` or baseline, a `.py` file not named like a kernel) is never skipped in silence: it is logged
as a warning and listed in `Imported.skipped`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kbverify.core import labels as labels_module
from kbverify.core.errors import InputError
from kbverify.core.labels import Labels
from kbverify.core.submissions import Submission, make_submission, read_source as read_python
from kbverify.core.tasks import Task, find_task, load_task, parse_task
from kbverify.rescore.references import is_known_reference

log = logging.getLogger(__name__)

FORMATS = ("auto", "kernelbench", "cuda-l1", "jsonl")
KERNEL_FILE = re.compile(r"^level_(?P<level>\d+)_problem_(?P<problem>\d+)_sample_(?P<sample>\d+)_kernel\.py$")
_TASK_FILE = re.compile(r"^(?P<id>\d+)_.+\.py$")
_LEVEL_DIR = re.compile(r"^level_?(?P<level>\d+)$")
# Generation scripts write this when no code block could be extracted from the model's answer.
_NO_CODE = ("", "None")


@dataclass(frozen=True)
class Entry:
    entry_id: str  # unique within the source and stable across imports: "level1/19/s0" or the JSONL "id"
    task: Task | None
    submission: Submission | None
    level: int | None
    problem_id: int | None
    sample: int
    claimed_speedup: float | None
    unverifiable: str | None  # why it cannot be verified; None when it can
    reference_origin: str  # "tasks_dir" | "ref_code" | "jsonl"
    modified_reference: bool | None  # ref_code differs from every known KernelBench version (None: unknown)
    task_ref: str = ""  # the task as the source names it: "level1/19", or the JSONL's task path
    labels: Labels = ()  # the generic JSONL's extra fields, e.g. (("model", "gpt-4o"),) (`kbverify.core.labels`)

    @property
    def verifiable(self) -> bool:
        return self.unverifiable is None


@dataclass(frozen=True)
class SkippedFile:
    """A file of the source that was not used, and why."""

    path: str
    reason: str

    def to_dict(self) -> dict:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class Imported:
    entries: list[Entry]
    fmt: str  # the format read: kernelbench | cuda-l1 | jsonl (what auto detected)
    skipped: tuple[SkippedFile, ...] = ()  # files of a run folder that could not be used (each also logged)


def load_entries(source: str | Path, *, fmt: str = "auto", tasks_dir: Path | None = None) -> list[Entry]:
    """Every entry of a published run, in source order. Raises InputError on malformed input."""
    return read_source(source, fmt=fmt, tasks_dir=tasks_dir).entries


def read_source(source: str | Path, *, fmt: str = "auto", tasks_dir: Path | None = None) -> Imported:
    """Every entry of a published run, in source order, and the files of it that could not be used."""
    source = Path(source)
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if not source.exists():
        raise InputError(f"{source}: no such file or folder")
    if tasks_dir is not None and not Path(tasks_dir).is_dir():
        raise InputError(f"{tasks_dir}: no such tasks folder")
    if fmt == "auto":
        fmt = detect_format(source)
    skipped: list[SkippedFile] = []
    if fmt == "kernelbench":
        entries = _load_kernelbench(source, tasks_dir, skipped)
    elif fmt == "cuda-l1":
        entries = _load_cuda_l1(source, tasks_dir)
    else:
        entries = _load_jsonl(source)
    unverifiable = sum(not entry.verifiable for entry in entries)
    log.info("%s: %d entries (%s), %d unverifiable", source, len(entries), fmt, unverifiable)
    for file in skipped:
        log.warning("%s: not used: %s", file.path, file.reason)
    return Imported(entries=entries, fmt=fmt, skipped=tuple(skipped))


def detect_format(source: Path) -> str:
    if source.is_dir():
        return "kernelbench"
    for _, row in json_lines(source):
        if "custom_code" in row or "level_id" in row:
            return "cuda-l1"
        if "task" in row:
            return "jsonl"
        raise InputError(f"{source}:1: cannot tell the format: expected CUDA-L1 keys (level_id, custom_code) "
                         f"or generic keys (task, code|path); use --format")
    raise InputError(f"{source}: empty file")


# --- reading -----------------------------------------------------------------------------------------------------

def json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not JSON: {error.msg} (column {error.colno})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def _require(row: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [key for key in keys if key not in row]
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(missing)}")


def _int_field(row: dict, key: str, where: str, default: int | None = None) -> int | None:
    value = row.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.isdigit():
            return int(value)
        raise InputError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def _speedup_field(row: dict, key: str, where: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {key} must be a number or null, got {value!r}")
    return float(value)


def _add_unique(entries: dict[str, Entry], entry: Entry, where: str) -> None:
    if entry.entry_id in entries:
        raise InputError(f"{where}: duplicate entry id {entry.entry_id!r}")
    entries[entry.entry_id] = entry


def _string_or_null(row: dict, key: str, where: str) -> None:
    """A submission's source is a string, or null where none was released; any other type is bad input (exit 2),
    not an entry to call unverifiable (docs/formats.md: "a value of the wrong type")."""
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{where}: {key} must be a string (the submission's source) or null, got "
                         f"{type(value).__name__} {str(value)[:40]}")


def _no_code_reason(code: object, what: str) -> str | None:
    if code is None:
        return f"no code released ({what} is null)"
    if not isinstance(code, str):
        return f"{what} is not a string"
    if code.strip() in _NO_CODE:
        return f"no code released ({what} is {code.strip()!r})"
    return None


# --- KernelBench run folder --------------------------------------------------------------------------------------

def _load_kernelbench(folder: Path, tasks_dir: Path | None, skipped: list[SkippedFile]) -> list[Entry]:
    if not folder.is_dir():
        raise InputError(f"{folder}: a KernelBench run is a folder of level_L_problem_P_sample_S_kernel.py files")
    kernels = []
    for path in sorted(folder.iterdir()):
        match = KERNEL_FILE.match(path.name)
        if match:
            kernels.append((int(match["level"]), int(match["problem"]), int(match["sample"]), path))
        elif path.suffix == ".py":
            skipped.append(SkippedFile(str(path), "not named level_L_problem_P_sample_S_kernel.py"))
    if not kernels:
        raise InputError(f"{folder}: no level_L_problem_P_sample_S_kernel.py files")
    if tasks_dir is None:
        raise InputError(f"{folder}: a KernelBench run names its tasks by id only; give the tasks folder (--tasks)")
    kernels.sort()
    claims = _kernelbench_claims(folder, {level for level, *_ in kernels}, skipped)
    tasks: dict[tuple[int, int], Task | str] = {}
    entries = []
    for level, problem_id, sample, path in kernels:
        if (level, problem_id) not in tasks:
            tasks[(level, problem_id)] = _find_task_or_reason(Path(tasks_dir), level, problem_id)
        task = tasks[(level, problem_id)]
        submission, code_reason = _kernel_file(path, skipped)
        entries.append(Entry(
            entry_id=f"level{level}/{problem_id}/s{sample}",
            task=None if isinstance(task, str) else task,
            submission=submission,
            level=level, problem_id=problem_id, sample=sample,
            claimed_speedup=claims.get((level, problem_id, sample)),
            unverifiable=code_reason or (task if isinstance(task, str) else None),
            reference_origin="tasks_dir",
            modified_reference=None,
            task_ref=f"level{level}/{problem_id}",
        ))
    return entries


def _kernel_file(path: Path, skipped: list[SkippedFile]) -> tuple[Submission | None, str | None]:
    """The kernel of one file, or why there is none; an unreadable file makes its entry unverifiable, listed."""
    try:
        code = read_python(path)  # as Python reads it: a UTF-8 byte-order mark or a coding line is no error
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as error:
        reason = f"cannot read the kernel file: {error}"
        skipped.append(SkippedFile(str(path), reason))
        return None, reason
    code_reason = _no_code_reason(code, "the kernel file")
    return (make_submission(code, id=path.name, path=str(path)) if code_reason is None else None), code_reason


def _find_task_or_reason(tasks_dir: Path, level: int, problem_id: int) -> Task | str:
    try:
        task = find_task(tasks_dir, level, problem_id)
    except InputError as error:
        # One unreadable task must not stop a re-score of hundreds: the entry says why it was skipped.
        return f"task level{level}/{problem_id} unusable: {error}"
    return task if task is not None else f"task level{level}/{problem_id} not found in {tasks_dir}"


def _kernelbench_claims(folder: Path, levels: set[int], skipped: list[SkippedFile]) -> dict[tuple[int, int, int],
                                                                                             float]:
    """(level, problem, sample) → claimed speedup: eval_results.json ÷ baseline, overridden by claims.jsonl."""
    claims: dict[tuple[int, int, int], float] = {}
    eval_path = folder / "eval_results.json"
    if eval_path.exists():
        try:
            claims.update(_eval_results_claims(eval_path, folder, levels))
        except _Unusable as error:
            # KernelBench's own files only carry claims: the kernels are re-scored without them, and it is said.
            skipped.append(SkippedFile(error.path, f"{error.reason}; its claimed speedups are not used"))
    claims_path = folder / "claims.jsonl"
    if claims_path.is_file():
        for number, row in json_lines(claims_path):
            where = f"{claims_path}:{number}"
            _require(row, ("level", "problem_id", "claimed_speedup"), where)
            key = (_int_field(row, "level", where), _int_field(row, "problem_id", where),
                   _int_field(row, "sample", where, default=0))
            speedup = _speedup_field(row, "claimed_speedup", where)
            if speedup is None:
                claims.pop(key, None)
            else:
                claims[key] = speedup
    return claims


class _Unusable(Exception):
    """A claims file of a run folder that cannot be used (the folder's kernels still can)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


def _read_claims_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise _Unusable(path, f"cannot read: {error}") from None
    except json.JSONDecodeError as error:
        raise _Unusable(path, f"not JSON (line {error.lineno}: {error.msg})") from None


def _eval_results_claims(eval_path: Path, folder: Path, levels: set[int]) -> dict[tuple[int, int, int], float]:
    results = _read_claims_json(eval_path)
    if not isinstance(results, dict) or not all(str(key).isdigit() and isinstance(samples, list)
                                                and all(isinstance(sample, dict) for sample in samples)
                                                for key, samples in results.items()):
        raise _Unusable(eval_path, "expected {\"<problem_id>\": [{sample_id, correctness, runtime}, ...]}")
    baselines = sorted(folder.glob("baseline_time*.json"))
    if not baselines:
        log.info("%s: no baseline_time*.json beside it; runtimes alone give no claimed speedup", eval_path)
        return {}
    if len(baselines) > 1:
        raise InputError(f"{folder}: several baseline files ({', '.join(p.name for p in baselines)}); keep one")
    if len(levels) > 1:
        # eval_results.json is keyed by problem id alone: with several levels in one folder it is ambiguous.
        raise InputError(f"{eval_path}: keyed by problem id only, but the folder holds levels "
                         f"{', '.join(map(str, sorted(levels)))}; give claims.jsonl instead")
    (level,) = levels
    baseline = _read_claims_json(baselines[0])
    if not isinstance(baseline, dict) or not isinstance(baseline.get(f"level{level}", {}), dict):
        raise _Unusable(baselines[0], "expected {\"level1\": {\"19_ReLU.py\": {\"mean\": ms}}}")
    level_times = baseline.get(f"level{level}", {})
    claims = {}
    for problem_key, samples in results.items():
        where = f"{eval_path}: problem {problem_key}"
        problem_id = int(problem_key)
        baseline_ms = _baseline_mean(level_times, problem_id)
        for sample in samples:
            missing = [key for key in ("sample_id", "correctness", "runtime") if key not in sample]
            if missing:
                raise _Unusable(eval_path, f"problem {problem_key}: a sample result lacks {', '.join(missing)}")
            runtime = sample["runtime"]
            # KernelBench writes runtime -1.0 for a kernel it did not time; such a kernel claims nothing.
            if (not sample["correctness"] or baseline_ms is None or not isinstance(runtime, (int, float))
                    or runtime <= 0):
                continue
            try:
                sample_id = _int_field(sample, "sample_id", where)
            except InputError as error:
                raise _Unusable(eval_path, str(error).removeprefix(f"{eval_path}: ")) from None
            claims[(level, problem_id, sample_id)] = baseline_ms / runtime
    return claims


def _baseline_mean(level_times: dict, problem_id: int) -> float | None:
    for file_name, stats in level_times.items():
        match = _TASK_FILE.match(file_name)
        if match and int(match["id"]) == problem_id and isinstance(stats, dict):
            mean = stats.get("mean")
            return float(mean) if isinstance(mean, (int, float)) and mean > 0 else None
    return None


# --- CUDA-L1 JSON Lines ------------------------------------------------------------------------------------------

def _load_cuda_l1(path: Path, tasks_dir: Path | None) -> list[Entry]:
    if not path.is_file():
        raise InputError(f"{path}: the CUDA-L1 format is a JSON Lines file")
    entries: dict[str, Entry] = {}
    for number, row in json_lines(path):
        where = f"{path}:{number}"
        _require(row, ("level_id", "task_id", "ref_code", "custom_code"), where)
        level = _int_field(row, "level_id", where)
        problem_id = _int_field(row, "task_id", where)
        _add_unique(entries, _cuda_l1_entry(row, level, problem_id, tasks_dir, where), where)
    return list(entries.values())


def _cuda_l1_entry(row: dict, level: int, problem_id: int, tasks_dir: Path | None, where: str) -> Entry:
    entry_id = f"level{level}/{problem_id}/s0"
    name = f"{problem_id}_level{level}"
    if tasks_dir is not None:
        # Only the name is borrowed: the row is scored against its own ref_code, whatever the folder holds.
        known = _find_task_or_reason(Path(tasks_dir), level, problem_id)
        if not isinstance(known, str):
            name = known.name
    task, reason, modified = None, None, None
    ref_code = row["ref_code"]
    if not isinstance(ref_code, str) or not ref_code.strip():
        reason = "no reference code (ref_code is empty)"
    else:
        try:
            task = parse_task(ref_code, name=name, level=level, problem_id=problem_id, path=None)
        except InputError as error:
            reason = f"ref_code is not a task: {error}"
        modified = _modified(level, problem_id, ref_code)
    _string_or_null(row, "custom_code", where)
    code = row["custom_code"]
    code_reason = _no_code_reason(code, "custom_code")
    submission = make_submission(code, id=entry_id) if code_reason is None else None
    return Entry(
        entry_id=entry_id, task=task, submission=submission, level=level, problem_id=problem_id, sample=0,
        claimed_speedup=_speedup_field(row, "score_default", where),
        unverifiable=code_reason or reason, reference_origin="ref_code", modified_reference=modified,
        task_ref=f"level{level}/{problem_id}",
    )


def _modified(level: int | None, problem_id: int | None, ref_code: str) -> bool | None:
    if level is None or problem_id is None:
        return None
    known = is_known_reference(level, problem_id, ref_code)
    return None if known is None else not known


# --- generic JSON Lines (docs/formats.md) ----------------------------------------------------------------

def _load_jsonl(path: Path) -> list[Entry]:
    if not path.is_file():
        raise InputError(f"{path}: the generic format is a JSON Lines file")
    entries: dict[str, Entry] = {}
    for number, row in json_lines(path):
        where = f"{path}:{number}"
        _add_unique(entries, _jsonl_entry(row, path.parent, where), where)
    return list(entries.values())


JSONL_KEYS = frozenset({"task", "code", "path", "id", "sample", "level", "problem_id", "claimed_speedup", "ref_code"})


def _jsonl_entry(row: dict, root: Path, where: str) -> Entry:
    _require(row, ("task",), where)
    if "code" not in row and "path" not in row:
        raise InputError(f"{where}: missing key code or path (the submission)")
    if not isinstance(row["task"], str) or not row["task"]:
        raise InputError(f"{where}: task must be a path, got {row['task']!r}")
    task_path = root / row["task"]
    sample = _int_field(row, "sample", where, default=0)
    level = _int_field(row, "level", where, default=_level_from_path(task_path))
    problem_id = _int_field(row, "problem_id", where, default=_problem_id_from_path(task_path))
    labels = labels_module.from_row(row, JSONL_KEYS, where)
    # Two models' kernels for one task and sample are two entries: without an id, the labels tell them apart.
    default_id = f"{Path(row['task']).with_suffix('').as_posix()}/s{sample}"
    entry_id = row.get("id", f"{labels_module.key(labels)}/{default_id}" if labels else default_id)
    if not isinstance(entry_id, (str, int)) or isinstance(entry_id, bool):
        raise InputError(f"{where}: id must be a string, got {entry_id!r}")
    entry_id = str(entry_id)

    task, reason, modified, origin = _jsonl_task(row, root, task_path, level, problem_id, where)
    submission, code_reason = _jsonl_submission(row, root, entry_id, where)
    return Entry(
        entry_id=entry_id, task=task, submission=submission, level=level, problem_id=problem_id, sample=sample,
        claimed_speedup=_speedup_field(row, "claimed_speedup", where),
        unverifiable=code_reason or reason, reference_origin=origin, modified_reference=modified,
        task_ref=row["task"], labels=labels,
    )


def _jsonl_task(row: dict, root: Path, task_path: Path, level: int | None, problem_id: int | None,
                where: str) -> tuple[Task | None, str | None, bool | None, str]:
    """(task, why it is unusable, whether ref_code differs from KernelBench's, where the reference came from).

    A row's own `ref_code` wins over the task file it names: it is the reference the kernel was written against.
    """
    ref_code = row.get("ref_code")
    if ref_code is None:
        if not task_path.is_file():
            return None, f"task {row['task']} not found in {root}", None, "jsonl"
        try:
            return load_task(task_path, level=level), None, None, "jsonl"
        except InputError as error:
            return None, f"task unusable: {error}", None, "jsonl"
    if not isinstance(ref_code, str):
        raise InputError(f"{where}: ref_code must be a string")
    task, reason = None, None
    try:
        task = parse_task(ref_code, name=task_path.stem, level=level, problem_id=problem_id)
    except InputError as error:
        reason = f"ref_code is not a task: {error}"
    return task, reason, _modified(level, problem_id, ref_code), "ref_code"


def _jsonl_submission(row: dict, root: Path, entry_id: str, where: str) -> tuple[Submission | None, str | None]:
    """(submission, why there is none): from the row's `code`, else from the file its `path` names."""
    if "code" in row:
        _string_or_null(row, "code", where)
        reason = _no_code_reason(row["code"], "code")
        return (make_submission(row["code"], id=entry_id) if reason is None else None), reason
    if not isinstance(row["path"], str):
        raise InputError(f"{where}: path must be a string, got {row['path']!r}")
    submission_path = root / row["path"]
    if not submission_path.is_file():
        return None, f"submission file {row['path']} not found in {root}"
    try:
        code = read_python(submission_path)
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as error:
        raise InputError(f"{submission_path}: cannot read: {error}") from None
    reason = _no_code_reason(code, "the submission file")
    return (make_submission(code, id=entry_id, path=str(submission_path)) if reason is None else None), reason


def _level_from_path(path: Path) -> int | None:
    match = _LEVEL_DIR.match(path.parent.name)
    return int(match["level"]) if match else None


def _problem_id_from_path(path: Path) -> int | None:
    match = _TASK_FILE.match(path.name)
    return int(match["id"]) if match else None
