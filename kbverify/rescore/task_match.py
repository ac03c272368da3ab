"""Does the tasks folder fit the source? Checked after the source is read and before any work starts.

A KernelBench run folder names its tasks by level and problem id only, so `rescore --tasks` one folder too high
finds none of them (every unit `unverifiable`), and a folder of other tasks finds tasks with the same ids that
are not the ones the kernels were written for (every verdict against the wrong reference). Both ran to exit 0.
Two pieces of evidence are read from the sources alone, without running anything:

- found: how many of the tasks the source names the folder holds;
- fit: whether each kernel's `ModelNew` can take what its task gives `Model` (the number of constructor and
  forward arguments, where both files make it plain). A kernel that provably cannot is a real failure when the
  task is right, but when most kernels of a run cannot, the tasks are not the ones the run was made against.

A source is refused when fewer than half of its tasks are found, or when more than half of the kernels that can
be told do not fit; a folder that finds some but not all is accepted with a warning and a field in the result.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InputError

log = logging.getLogger(__name__)

_EXAMPLES = 3


@dataclass(frozen=True)
class TaskMatch:
    """How the tasks of a source were found: `named` distinct tasks, `found` of them usable."""

    named: int
    found: int
    missing: tuple[str, ...]  # the tasks not found, as the source names them ("level1/19", "level1/19_ReLU.py")
    checked: int  # kernels whose fit to their task could be told
    misfits: tuple[str, ...]  # "<entry id>: <why>" for kernels that cannot take their task's inputs


def require_tasks_fit(entries: list, *, fmt: str, source: Path, tasks_dir: Path | None) -> TaskMatch:
    """Refuse a source whose tasks are mostly not where it was pointed, or not the ones its kernels were written
    for; warn (and return what is missing) when some are not found. `entries` are `kbverify.rescore.importers.Entry`."""
    if fmt == "jsonl" and tasks_dir is not None:
        raise InputError(f"--tasks {tasks_dir}: a generic JSONL names each task file itself (relative to "
                         f"{source.parent}); leave --tasks out")
    match = _match(entries, fmt, tasks_dir)
    where = f"--tasks {tasks_dir}" if tasks_dir is not None else f"{source}"
    if match.named and match.found * 2 < match.named:
        raise InputError(f"{where}: {match.found} of the {match.named} tasks the source names were found "
                         f"(missing e.g. {', '.join(match.missing[:_EXAMPLES])}){_hint(entries, fmt, tasks_dir)}")
    if match.checked and len(match.misfits) * 2 > match.checked:
        raise InputError(f"{where}: {len(match.misfits)} of {match.checked} kernels cannot take the inputs of the "
                         f"task they were matched to (e.g. {match.misfits[0]}); are these the tasks the run was "
                         f"made against?")
    if match.missing:
        log.warning("%s: %d of the %d tasks the source names were not found (e.g. %s); their entries are "
                    "unverifiable", where, len(match.missing), match.named, ", ".join(match.missing[:_EXAMPLES]))
    return match


def _match(entries: list, fmt: str, tasks_dir: Path | None) -> TaskMatch:
    found: dict[str, bool] = {}
    checked, misfits = 0, []
    for entry in entries:
        if fmt == "cuda-l1":
            if tasks_dir is not None:  # the folder only lends names: scored against the row's own ref_code
                found.setdefault(entry.task_ref, _holds(tasks_dir, entry.level, entry.problem_id))
            continue
        if entry.reference_origin == "ref_code":
            continue
        found[entry.task_ref] = found.get(entry.task_ref, False) or entry.task is not None
        if entry.task is not None and entry.submission is not None:
            reason = call_misfit(entry.task.source, entry.submission.source)
            if reason != "":
                checked += 1
                if reason is not None:
                    misfits.append(f"{entry.entry_id}: {reason} ({entry.task.name})")
    missing = tuple(ref for ref, ok in found.items() if not ok)
    return TaskMatch(named=len(found), found=len(found) - len(missing), missing=missing, checked=checked,
                     misfits=tuple(misfits))


def _holds(tasks_dir: Path, level: int | None, problem_id: int | None) -> bool:
    if level is None or problem_id is None:
        return False
    return any((tasks_dir / f"level{level}").glob(f"{problem_id}_*.py"))


def _hint(entries: list, fmt: str, tasks_dir: Path | None) -> str:
    """Name a folder next to the one given that holds more of the tasks: the usual mistake is one level off."""
    if tasks_dir is None or fmt not in ("kernelbench", "cuda-l1"):
        return ""
    wanted = {(entry.level, entry.problem_id) for entry in entries}
    candidates = [path for path in sorted(tasks_dir.iterdir()) if path.is_dir()] + [tasks_dir.parent]
    best, best_count = None, sum(_holds(tasks_dir, *pair) for pair in wanted)
    for candidate in candidates:
        count = sum(_holds(candidate, *pair) for pair in wanted)
        if count > best_count:
            best, best_count = candidate, count
    if best is None:
        return "; point --tasks at the folder that holds the level1/, level2/, ... folders"
    return f"; {best} holds {best_count} of them"


# --- does a kernel fit its task -----------------------------------------------------------------------------------

def call_misfit(task_source: str, kernel_source: str) -> str | None:
    """Why `ModelNew` cannot be called the way the task calls `Model`, None when it can, "" when the sources do
    not tell (a parse error, an inherited or decorated method, inputs built in a loop)."""
    task, kernel = _parse(task_source), _parse(kernel_source)
    if task is None or kernel is None:
        return ""
    told = False
    for method, producer, what in (("__init__", "get_init_inputs", "constructor arguments"),
                                   ("forward", "get_inputs", "inputs")):
        given = _returned_count(task, producer)
        if given is None:
            given = _arity(_class(task, "Model"), method)
        taken = _arity(_class(kernel, "ModelNew"), method)
        if given is None or taken is None:
            continue
        told = True
        if not _overlap(given, taken):
            return f"ModelNew.{method} takes {_describe(taken)} {what}, the task gives {_describe(given)}"
    return None if told else ""


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    return found[-1] if found else None


def _arity(cls: ast.ClassDef | None, method: str) -> tuple[int, int | None] | None:
    """(fewest, most) positional arguments `cls.method` takes besides self; most None for *args."""
    if cls is None:
        return None
    functions = [node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method]
    if not functions or functions[-1].decorator_list:
        return None
    args = functions[-1].args
    if any(default is None for default in args.kw_defaults):
        return None  # a required keyword-only argument: not called positionally, cannot be told
    positional = [*args.posonlyargs, *args.args][1:]
    fewest = len(positional) - len(args.defaults)
    return max(fewest, 0), None if args.vararg else len(positional)


def _returned_count(tree: ast.Module, function: str) -> tuple[int, int] | None:
    """How many values `function` returns when every return is a list or tuple display without a star."""
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function]
    if not functions:
        return None
    counts = set()
    for node in ast.walk(functions[-1]):
        if isinstance(node, ast.Return):
            value = node.value
            if not isinstance(value, (ast.List, ast.Tuple)) or any(isinstance(e, ast.Starred) for e in value.elts):
                return None
            counts.add(len(value.elts))
    if len(counts) != 1:
        return None
    (count,) = counts
    return count, count


def _overlap(first: tuple[int, int | None], second: tuple[int, int | None]) -> bool:
    low = max(first[0], second[0])
    highs = [high for high in (first[1], second[1]) if high is not None]
    return not highs or low <= min(highs)


def _describe(span: tuple[int, int | None]) -> str:
    fewest, most = span
    if most is None:
        return f"{fewest} or more"
    return str(fewest) if fewest == most else f"{fewest} to {most}"
