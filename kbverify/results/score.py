"""fast_p tables from scored rows: KernelBench's eval results, a generic JSONL, or kbverify's own verdicts.

fast_p = (1/N) * #(correct and speedup > p), strict, N = every task in the set (failures included), one sample
per task (`first`, as KernelBench scores, or `best`, as KernelBench-Verified does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kbverify.core import stats
from kbverify.core.errors import InputError
from kbverify.core.labels import from_row as labels_from_row
from kbverify.core.present import pct

logger = logging.getLogger(__name__)

DEFAULT_PS = (0.0, 0.5, 1.0, 1.5, 2.0)
SAMPLE_MODES = ("first", "best")

_LEVEL_IN_PATH = re.compile(r"(?:^|/)level_?(\d+)(?:/|$)")
_PROBLEM_ID = re.compile(r"^(\d+)_")


@dataclass(frozen=True)
class ScoreRow:
    """One scored sample of one task; `speedup` is None when the sample failed or was never timed."""

    task: str
    level: int | None
    sample: int
    correct: bool
    speedup: float | None
    speedup_ci_low: float | None = None
    claimed_speedup: float | None = None
    labels: tuple[tuple[str, str], ...] = ()  # `kbverify.core.labels`: rows that differ in them are different kernels


@dataclass(frozen=True)
class FastP:
    p: float
    fast_p: float
    ci_low: float  # bootstrap over tasks
    ci_high: float
    n_fast: int
    confident_fast_p: float | None  # lower CI bound of the speedup > p; None when no row carries a CI


@dataclass(frozen=True)
class GeomeanSpeedup:
    speedup: float
    ci_low: float
    ci_high: float
    n_kernels: int  # correct kernels with a measured speedup


@dataclass(frozen=True)
class ScoreTable:
    n_tasks: int
    n_correct: int
    samples: str  # "first" | "best"
    fast: tuple[FastP, ...]
    geomean: GeomeanSpeedup | None
    confidence: float = 0.95
    level: int | None = None  # set on the per-level tables in `by_level`
    by_level: tuple[ScoreTable, ...] = ()
    excluded: tuple[str, ...] = ()  # tasks removed from the denominator (degenerate per an audit)

    def at(self, p: float) -> FastP:
        for entry in self.fast:
            if entry.p == p:
                return entry
        raise KeyError(f"fast_p was not computed for p = {p}")


def select_samples(rows: Iterable[ScoreRow], mode: str) -> list[ScoreRow]:
    """One row per task (per task and label set: two models' kernels for one task are two): `first` = the smallest
    sample id; `best` = the fastest correct sample, else the first."""
    if mode not in SAMPLE_MODES:
        raise InputError(f"unknown sample selection {mode!r}; expected one of {', '.join(SAMPLE_MODES)}")
    by_task: dict[tuple, list[ScoreRow]] = {}
    for row in rows:
        by_task.setdefault((row.labels, row.level, row.task), []).append(row)
    return [_select_one(group, mode) for group in by_task.values()]


def score_rows(
    rows: Iterable[ScoreRow],
    ps: Sequence[float] = DEFAULT_PS,
    *,
    samples: str = "first",
    exclude: set[str] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> ScoreTable:
    """fast_p for each p, with a bootstrap CI over tasks, confident fast_p, the geomean speedup, and per level.

    A task is excluded when `exclude` names it as given, by file name or stem, as `level<L>/<stem>`, or by level
    and problem id (`level2/80_Gemm_Max_Subtract_GELU` excludes a row of level 2 whose task name starts with `80_`:
    published runs rename tasks, as CUDA-L1's `80_level2`). The table lists every excluded task.
    """
    excluded_names = {_strip_py(name) for name in exclude or ()}
    excluded_ids = {key for key in map(_level_and_id, excluded_names) if key is not None}
    kept, excluded = [], set()
    for row in rows:
        row_id = _level_and_id(f"level{row.level}/{Path(row.task).stem}") if row.level is not None else None
        if _names(row) & excluded_names or (row_id is not None and row_id in excluded_ids):
            excluded.add(row.task)
        else:
            kept.append(row)
    selected = select_samples(kept, samples)
    options = dict(ps=tuple(ps), samples=samples, n_boot=n_boot, seed=seed, confidence=confidence)
    levels = sorted({row.level for row in selected if row.level is not None})
    by_level = tuple(
        _table([row for row in selected if row.level == level], level=level, **options) for level in levels
    )
    return dataclasses.replace(
        _table(selected, level=None, **options), by_level=by_level, excluded=tuple(sorted(excluded))
    )


def read_kernelbench_eval(
    eval_results_path: str | Path,
    baseline_json_path: str | Path,
    level: int,
    task_names: dict[int, str] | None = None,
) -> list[ScoreRow]:
    """Rows exactly as KernelBench's `benchmark_eval_analysis.py` scores a run (sample 0 of each problem).

    speedup = baseline `mean` / eval `runtime` (both mean ms); a problem absent from the eval results counts as
    incorrect; problems absent from the baseline are skipped, so N = the problems the baseline holds for `level`.
    Rows are paired with the baseline by problem id; KernelBench pairs them by position, which only agrees when no
    problem is missing in the middle of the eval results. A correct but untimed sample (runtime -1) gets speedup
    None, which scores as KernelBench's negative speedup does for every p >= 0.
    """
    eval_results = _load_json(eval_results_path, "eval results")
    baseline = _load_json(baseline_json_path, "baseline timings")
    if not isinstance(eval_results, dict):
        raise InputError(f"{eval_results_path}: expected an object keyed by problem id")
    level_times = baseline.get(f"level{level}") if isinstance(baseline, dict) else None
    if not isinstance(level_times, dict):
        raise InputError(f"{baseline_json_path}: no timings for level{level}")
    problems = _baseline_problems(level_times, task_names, baseline_json_path)
    rows = []
    for problem_id, file_name in problems:
        baseline_ms = _baseline_mean_ms(level_times[file_name], file_name, baseline_json_path)
        entry = _sample_zero(eval_results.get(str(problem_id)), problem_id, eval_results_path)
        rows.append(_kernelbench_row(entry, Path(file_name).stem, level, baseline_ms))
    absent = sum(1 for problem_id, _ in problems if str(problem_id) not in eval_results)
    if absent:
        logger.info("level%d: %d of %d problems have no eval result and count as incorrect", level, absent, len(rows))
    return rows


def read_score_jsonl(path: str | Path) -> list[ScoreRow]:
    """Rows from JSONL lines `{"task", "correct", "speedup", "sample"?, "level"?, "speedup_ci_low"?, ...}`."""
    from kbverify.rescore.importers import json_lines

    path = Path(path)
    _not_a_json_document(path)
    rows = [_score_row(row, f"{path}:{number}") for number, row in json_lines(path)]
    if not rows:
        raise InputError(f"{path}: no scored lines")
    return rows


def table_to_dict(table: ScoreTable) -> dict:
    """JSON-ready form of a table, per-level tables nested under `by_level`.

    Keys: n_tasks, n_correct, samples, confidence, level, rows (one per p: p, fast_p, fast_p_ci, n_fast,
    confident_fast_p), geomean_speedup, geomean_speedup_ci, n_geomean, by_level, excluded.
    """
    geo = table.geomean
    return {
        "n_tasks": table.n_tasks,
        "n_correct": table.n_correct,
        "samples": table.samples,
        "confidence": table.confidence,
        "level": table.level,
        "rows": [
            {"p": e.p, "fast_p": e.fast_p, "fast_p_ci": [e.ci_low, e.ci_high], "n_fast": e.n_fast,
             "confident_fast_p": e.confident_fast_p}
            for e in table.fast
        ],
        "geomean_speedup": None if geo is None else geo.speedup,
        "geomean_speedup_ci": None if geo is None else [geo.ci_low, geo.ci_high],
        "n_geomean": 0 if geo is None else geo.n_kernels,
        "by_level": [table_to_dict(sub) for sub in table.by_level],
        "excluded": list(table.excluded),
    }


def format_table_markdown(table: ScoreTable) -> str:
    """The table as Markdown: fast_p with CIs, the geomean speedup, per-level fast_p, and exclusions."""
    percent = f"{table.confidence:.0%}"
    lines = [
        f"**fast_p**: {table.n_tasks} tasks, {table.n_correct} correct, samples: {table.samples}",
        "",
        f"| p | fast_p | {percent} CI | confident fast_p | fast tasks |",
        "|---|---|---|---|---|",
    ]
    for entry in table.fast:
        confident = "n/a" if entry.confident_fast_p is None else pct(entry.confident_fast_p)
        lines.append(
            f"| {entry.p:g} | {pct(entry.fast_p)} | {pct(entry.ci_low)} to {pct(entry.ci_high)} "
            f"| {confident} | {entry.n_fast}/{table.n_tasks} |"
        )
    lines += ["", _geomean_line(table.geomean, percent)]
    if table.by_level:
        lines += ["", *_level_lines(table)]
    if table.excluded:
        lines += ["", f"Excluded as degenerate ({len(table.excluded)}): {', '.join(table.excluded)}"]
    return "\n".join(lines) + "\n"


def _select_one(group: list[ScoreRow], mode: str) -> ScoreRow:
    ids = [row.sample for row in group]
    if len(set(ids)) != len(ids):
        raise InputError(f"task {group[0].task}: the same sample id appears more than once")
    first = min(group, key=lambda row: row.sample)
    if mode == "first":
        return first
    timed = [row for row in group if row.correct and row.speedup is not None]
    return max(timed, key=lambda row: (row.speedup, -row.sample)) if timed else first


def _table(rows: list[ScoreRow], *, level, ps, samples, n_boot, seed, confidence) -> ScoreTable:
    correct = [row.correct for row in rows]
    speedups = [row.speedup for row in rows]
    ci_lows = [row.speedup_ci_low for row in rows]
    has_cis = any(low is not None for low in ci_lows)
    fast = []
    for p in ps:
        low, high = stats.bootstrap_fast_p_ci(correct, speedups, p, n_boot=n_boot, seed=seed, confidence=confidence)
        share = stats.fast_p(correct, speedups, p)
        fast.append(FastP(
            p=float(p),
            fast_p=share,
            ci_low=low,
            ci_high=high,
            n_fast=round(share * len(rows)),
            confident_fast_p=stats.confident_fast_p(correct, ci_lows, p) if has_cis else None,
        ))
    measured = [s for ok, s in zip(correct, speedups) if ok and s is not None and math.isfinite(s) and s > 0]
    geo = stats.geomean_speedup_ci(measured, n_boot=n_boot, seed=seed, confidence=confidence)
    return ScoreTable(
        n_tasks=len(rows),
        n_correct=sum(correct),
        samples=samples,
        fast=tuple(fast),
        geomean=None if geo is None else GeomeanSpeedup(*geo, n_kernels=len(measured)),
        confidence=confidence,
        level=level,
    )


def _names(row: ScoreRow) -> set[str]:
    stem = Path(row.task).stem
    names = {_strip_py(row.task), stem}
    if row.level is not None:
        names.add(f"level{row.level}/{stem}")
    return names


def _level_and_id(name: str) -> tuple[int, int] | None:
    """(L, N) of "levelL/N_anything"; None for any other form."""
    head, _, stem = name.rpartition("/")
    number = stem.split("_", 1)[0]
    if not head.startswith("level") or not head[5:].isdigit() or not number.isdigit() or "_" not in stem:
        return None
    return int(head[5:]), int(number)


def _strip_py(name: str) -> str:
    return name[:-3] if name.endswith(".py") else name


def _not_a_json_document(path: Path) -> None:
    """A score JSONL holds one object a line; a whole JSON document given instead (KernelBench's
    eval_results.json, most often) is named as what it is, not reported as a line that is "not JSON"."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return  # json_lines says why it cannot be read
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return
    if len(lines) == 1 and isinstance(document, dict) and "task" in document:
        return  # a score JSONL of one line
    if isinstance(document, dict) and document and all(str(key).isdigit() and isinstance(value, list)
                                                       for key, value in document.items()):
        raise InputError(f"{path}: KernelBench's eval_results.json holds runtimes, not speedups: scoring it needs "
                         f"the baseline times they are divided into, --baseline baseline_time_torch.json --level L "
                         f"(see docs/formats.md, \"KernelBench's result files\"; examples/published_run/kernelbench_baseline.json "
                         f"is one)")
    if len(lines) > 1:
        raise InputError(f"{path}: one JSON document, not JSON Lines; score reads a store, a score JSONL (one "
                         f"object a line) or KernelBench's eval_results.json with --baseline and --level (see "
                         f"docs/formats.md)")


def _load_json(path: str | Path, what: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as error:
        raise InputError(f"{path}: cannot read {what} ({error.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: {what} are not valid JSON ({error})") from None


def _baseline_problems(level_times: dict, task_names: dict[int, str] | None, where) -> list[tuple[int, str]]:
    """(problem id, baseline key) for every problem both the task list and the baseline hold, by id."""
    if task_names is None:
        problems = []
        for key in level_times:
            match = _PROBLEM_ID.match(key)
            if not match:
                raise InputError(f"{where}: baseline key {key!r} does not start with a problem id")
            problems.append((int(match[1]), key))
        return sorted(problems)
    problems = []
    for problem_id, name in sorted(task_names.items()):
        key = next((k for k in (name, f"{name}.py") if k in level_times), None)
        if key is None:
            logger.info("problem %d (%s) has no baseline timing: not scored, as in KernelBench", problem_id, name)
        else:
            problems.append((problem_id, key))
    return problems


def _baseline_mean_ms(timing, name: str, where) -> float:
    mean = timing.get("mean") if isinstance(timing, dict) else None
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not mean > 0:
        raise InputError(f"{where}: baseline {name} has no positive 'mean'")
    return float(mean)


def _sample_zero(results, problem_id: int, where) -> dict | None:
    if results is None:
        return None
    entries = [results] if isinstance(results, dict) else results
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise InputError(f"{where}: problem {problem_id}: expected a list of sample results")
    zero = [entry for entry in entries if entry.get("sample_id", 0) == 0]
    if len(zero) > 1:
        raise InputError(f"{where}: problem {problem_id} has more than one result for sample 0")
    return zero[0] if zero else None


def _kernelbench_row(entry: dict | None, task: str, level: int, baseline_ms: float) -> ScoreRow:
    correct = bool(entry and entry.get("correctness") is True)
    runtime = entry.get("runtime") if entry else None
    timed = correct and isinstance(runtime, (int, float)) and not isinstance(runtime, bool) and runtime > 0
    return ScoreRow(task=task, level=level, sample=0, correct=correct,
                    speedup=baseline_ms / runtime if timed else None)


SCORE_KEYS = frozenset({"task", "correct", "speedup", "sample", "level", "speedup_ci_low", "claimed_speedup"})


def _score_row(data: dict, where: str) -> ScoreRow:
    task = data.get("task")
    if not isinstance(task, str) or not task:
        raise InputError(f"{where}: 'task' must be a non-empty string")
    if not isinstance(data.get("correct"), bool):
        raise InputError(f"{where}: 'correct' must be true or false")
    if "speedup" not in data:
        raise InputError(f"{where}: 'speedup' is missing (use null for an untimed sample)")
    sample = data.get("sample", 0)
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise InputError(f"{where}: 'sample' must be a non-negative integer")
    level = data.get("level", _level_from_path(task))
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise InputError(f"{where}: 'level' must be an integer")
    return ScoreRow(
        task=task,
        level=level,
        sample=sample,
        correct=data["correct"],
        speedup=_positive_or_none(data, "speedup", where),
        speedup_ci_low=_positive_or_none(data, "speedup_ci_low", where),
        claimed_speedup=_positive_or_none(data, "claimed_speedup", where),
        labels=labels_from_row(data, SCORE_KEYS, where),
    )


def _positive_or_none(data: dict, key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{where}: {key!r} must be a positive number or null")
    return float(value)


def _level_from_path(task: str) -> int | None:
    match = _LEVEL_IN_PATH.search(task.replace("\\", "/"))
    return int(match[1]) if match else None


def _geomean_line(geo: GeomeanSpeedup | None, percent: str) -> str:
    if geo is None:
        return "Geometric-mean speedup of correct kernels: n/a (no correct kernel was timed)"
    return (
        f"Geometric-mean speedup of correct kernels: {geo.speedup:.3g}x "
        f"({percent} CI {geo.ci_low:.3g}x to {geo.ci_high:.3g}x, {geo.n_kernels} kernels)"
    )


def _level_lines(table: ScoreTable) -> list[str]:
    ps = [entry.p for entry in table.fast]
    header = "| level | tasks | correct | " + " | ".join(f"fast_{p:g}" for p in ps) + " | geomean |"
    lines = [header, "|" + "---|" * (len(ps) + 4)]
    for sub in table.by_level:
        geo = "n/a" if sub.geomean is None else f"{sub.geomean.speedup:.3g}x"
        cells = " | ".join(pct(entry.fast_p) for entry in sub.fast)
        lines.append(f"| {sub.level} | {sub.n_tasks} | {sub.n_correct} | {cells} | {geo} |")
    return lines
