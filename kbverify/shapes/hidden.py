"""Hidden shapes: other values of a task's shape constants, found by a fixed rule and validated.

A kernel that hard-codes `batch_size = 128` passes every input set drawn at the task's own shapes. Hidden
shapes re-execute the task file with different literals for the constants that decide what `get_inputs()`
returns, so derived constants (`bias_shape = (out_channels, 1, 1)`) follow.

The rule (`RULE`), for each task:
  1. candidates: module-level constants bound to an int or a tuple of ints, minus names that are
     hyper-parameters by convention (eps, stride, padding, groups, kernel_size, dropout, num_heads, ...);
  2. shape constants: the candidates whose change alone changes the shapes `get_inputs()` returns
     (found by effect, on the meta device); among them, those that also change `get_init_inputs()` feed
     the constructor, and those that only move dimension 0 (or are named batch) are batch-like;
  3. two kinds of configuration: "smaller" halves each shape constant (2 and 3 lose one), "odd" moves each
     even one (>= 4) to n - 1, which is never a multiple of 8 (odd values are kept);
  4. each kind is tried over three scopes, the first that validates wins: every shape constant, then only
     those not fed to the constructor, then a greedy pass that adds one constant at a time (batch-like
     ones first) and keeps it when the configuration still validates;
  5. validation: the reference constructs and runs (on the meta device, so 6 GB tasks need no memory;
     for small tasks also for real on the CPU, where the output must be finite), the input shapes differ
     from the original's, and the estimated bytes (inputs, parameters, outputs) stay within the original's.

Committed manifests (`hidden_tests/<set>/levelL/<name>.json`) are keyed by task name and content hash;
a task whose hash has none gets the same rule run on the fly. Generating executes the task file: do it
where the task may run.

Rewriting the file's literals lives in `task_constants`, running the reference on meta (and the CPU) in
`meta_probe`; this module holds the rule, the manifests and `kbverify hidden generate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.shapes import hidden_larger
# meta_mode, quiet and tensors are named here for scripts/audit_work_profile.py, which profiles a task
# with the same quiet meta-device run the rule uses.
from kbverify.core.tasks import Task, execute_task, load_task_dir
from kbverify.shapes.meta_probe import Probe, describe, execute_source, probe_inputs, validate
from kbverify.shapes.meta_probe import meta_mode as _meta_mode  # noqa: F401
from kbverify.shapes.meta_probe import quiet as _quiet  # noqa: F401
from kbverify.shapes.meta_probe import tensors as _tensors  # noqa: F401
from kbverify.shapes.task_constants import bindings as _bindings
from kbverify.shapes.task_constants import is_int, rewrite_constants, tuplify
from kbverify.shapes.task_constants import parse_source as _parse

log = logging.getLogger(__name__)

RULE = ("kbverify-hidden/2: smaller (n//2, or n-1 for n<4), odd (n-1 for even n>=4); scopes all > inputs-only > "
        "greedy; larger (x2, within 8x the reference's peak, greedy groups); npot (n-1 where only powers of two)")
KINDS = ("smaller", "odd")
SCOPES = ("all", "inputs-only", "greedy")

# Name tokens (split on "_") that mark a hyper-parameter rather than a size, whatever its effect.
_HYPER_TOKENS = frozenset({
    "eps", "epsilon", "stride", "strides", "padding", "pad", "dilation", "groups", "group", "kernel", "p",
    "dropout", "drop", "heads", "layers", "momentum", "seed", "window", "patch",
})
_BATCH_NAMES = frozenset({"b", "bs", "batch", "batch_size", "batchsize", "n_batch"})


@dataclass(frozen=True)
class HiddenShape:
    label: str  # "hidden:0", "hidden:1", ...
    overrides: dict  # constant name -> new value
    input_shapes: tuple  # one entry per get_inputs() item: a shape tuple, or None for a non-tensor
    validation: str  # what ran: "meta", "meta+cpu", "cpu-init+meta", "cpu", ...
    kind: str = ""  # the rule's kind/scope: "smaller/all", "odd/greedy", "larger/all", "npot/one", ...
    kept: dict = dataclasses.field(default_factory=dict)  # larger shapes: constant left at its size → why

    def to_json(self) -> dict:
        data = {"label": self.label, "overrides": self.overrides, "input_shapes": self.input_shapes,
                "validation": self.validation, "kind": self.kind}
        return {**data, "kept": self.kept} if self.kept else data

    @classmethod
    def from_json(cls, data: dict) -> HiddenShape:
        return cls(label=data["label"], overrides={k: tuplify(v) for k, v in data["overrides"].items()},
                   input_shapes=tuplify(data["input_shapes"]), validation=data["validation"],
                   kind=data.get("kind", ""), kept=dict(data.get("kept") or {}))


@dataclass(frozen=True)
class Generation:
    """The rule's answer for one task: its hidden shapes, or why there are none."""

    shapes: list[HiddenShape]
    reason: str | None
    duration_s: float


# ---------------------------------------------------------------------------------------------------------
# The rule


@dataclass(frozen=True)
class _ShapeConstant:
    name: str
    value: object  # int or tuple of ints
    feeds_constructor: bool
    batch_like: bool


def _is_hyper_parameter(name: str) -> bool:
    return bool(set(name.lower().split("_")) & _HYPER_TOKENS)


def _candidates(source: str) -> dict[str, object]:
    candidates = {}
    for name, binding in _bindings(_parse(source)).items():
        value = binding.value
        is_size = is_int(value) or (isinstance(value, tuple) and value and all(is_int(v) for v in value))
        if is_size and not _is_hyper_parameter(name) and not name.startswith("_"):
            candidates[name] = value
    return candidates


def _perturbed(value: object) -> object:
    return tuple(v + 1 for v in value) if isinstance(value, tuple) else value + 1


def _shape_constants(task: Task, original: Probe) -> list[_ShapeConstant]:
    """The candidates whose change alone changes the input shapes, by executing the task on meta."""
    found = []
    for name, value in _candidates(task.source).items():
        probe = probe_inputs(task, rewrite_constants(task.source, {name: _perturbed(value)}))
        if probe.input_shapes is None or probe.input_shapes == original.input_shapes:
            continue
        only_dim0 = _only_leading_dim_changed(original.input_shapes, probe.input_shapes)
        feeds = probe.init_signature != original.init_signature
        batch_like = not feeds and (name.lower() in _BATCH_NAMES or "batch" in name.lower() or only_dim0)
        found.append(_ShapeConstant(name, value, feeds, batch_like))
    return found


def _only_leading_dim_changed(before: tuple, after: tuple) -> bool:
    if len(before) != len(after):
        return False
    for old, new in zip(before, after):
        if old == new:
            continue
        if old is None or new is None or len(old) != len(new) or not old or old[1:] != new[1:]:
            return False
    return True


def _step(kind: str, value: int) -> int:
    if kind == "smaller":
        # A batch of 2 is common in level 3; 1 is still a shape a hard-coded kernel gets wrong.
        return value // 2 if value >= 4 else max(value - 1, 1)
    # An odd size is already not a multiple of 8; 2 -> 1 would make a broadcastable dimension.
    return value - 1 if value >= 4 and value % 2 == 0 else value


def _new_value(kind: str, value: object) -> object:
    if isinstance(value, tuple):
        return tuple(_step(kind, v) for v in value)
    return _step(kind, value)


def _scope(constants: list[_ShapeConstant], scope: str) -> list[_ShapeConstant]:
    if scope == "all":
        return constants
    if scope == "inputs-only":
        return [c for c in constants if not c.feeds_constructor]
    # "greedy" adds one constant at a time: batch-like ones first, then the rest in file order.
    return sorted(constants, key=lambda c: not c.batch_like)


def generate_hidden_shapes(task: Task, *, max_configs: int = 2) -> list[HiddenShape]:
    """The task's hidden shapes by `RULE` (deterministic: the same task gives the same list)."""
    return _generate(task, max_configs).shapes


def _generate(task: Task, max_configs: int = 2) -> Generation:
    started = time.perf_counter()
    shapes, reason = _apply_rule(task, max_configs)
    return Generation(shapes=shapes, reason=reason, duration_s=time.perf_counter() - started)


def _apply_rule(task: Task, max_configs: int) -> tuple[list[HiddenShape], str | None]:
    original = validate(task, task.source)
    if original.validation is None:
        return [], f"the reference does not run at its own shapes: {original.error}"
    constants = _shape_constants(task, original)
    if not constants:
        return [], "no module-level constant changes the input shapes"
    found: list[HiddenShape] = []
    rejections: list[str] = []
    for kind in KINDS[:max_configs]:
        shape = _first_valid(task, kind, constants, original, rejections)
        if shape is not None and all(shape.input_shapes != other.input_shapes for other in found):
            found.append(dataclasses.replace(shape, label=f"hidden:{len(found)}"))
    # larger than the task's on every axis that can grow, then a size that is no power of two for each constant
    # left a power of two (kbverify.shapes.hidden_larger)
    larger, kept = hidden_larger.larger_shapes(task, constants, original, HiddenShape)
    for shape in larger:
        found = _added(found, shape)
    if kept and found:  # said once, by the first larger shape, or the first shape where none is larger
        carrier = next((i for i, shape in enumerate(found) if shape.kind.startswith("larger")), 0)
        found[carrier] = dataclasses.replace(found[carrier], kept=kept)
    for shape in hidden_larger.npot_shapes(task, constants, original, found, HiddenShape):
        found = _added(found, shape)
    return found, None if found else "; ".join(rejections) or "no configuration changes the input shapes"


def _added(found: list[HiddenShape], shape: HiddenShape) -> list[HiddenShape]:
    if any(shape.input_shapes == other.input_shapes for other in found):
        return found
    return [*found, dataclasses.replace(shape, label=f"hidden:{len(found)}")]


def _first_valid(task: Task, kind: str, constants: list[_ShapeConstant], original: Probe,
                 rejections: list[str]) -> HiddenShape | None:
    checked: dict[str, tuple[str | None, Probe]] = {}

    def check(overrides: dict, scope: str) -> Probe | None:
        key = repr(sorted(overrides.items()))
        if key not in checked:
            checked[key] = _check(task, overrides, original)
            if checked[key][0] is not None:
                log.debug("%s: %s/%s %s rejected: %s", task.name, kind, scope, overrides, checked[key][0])
                rejections.append(f"{kind}/{scope} {overrides}: {checked[key][0]}")
        problem, probe = checked[key]
        return probe if problem is None else None

    for scope in SCOPES:
        kept: dict = {}
        probe = None
        for constant in _scope(constants, scope):
            value = _new_value(kind, constant.value)
            if value == constant.value:
                continue
            if scope != "greedy":
                kept[constant.name] = value
            elif (trial := check({**kept, constant.name: value}, scope)) is not None:
                kept, probe = {**kept, constant.name: value}, trial
        if kept and scope != "greedy":
            probe = check(kept, scope)
        if kept and probe is not None:
            return HiddenShape(label="", overrides=kept, input_shapes=probe.input_shapes,
                               validation=probe.validation, kind=f"{kind}/{scope}")
    return None


def _check(task: Task, overrides: dict, original: Probe) -> tuple[str | None, Probe]:
    probe = validate(task, rewrite_constants(task.source, overrides))
    if probe.validation is None:
        return probe.error, probe
    if probe.input_shapes == original.input_shapes:
        return "input shapes unchanged", probe
    if original.estimated_bytes is not None and probe.estimated_bytes is not None \
            and probe.estimated_bytes > original.estimated_bytes:
        return f"needs {probe.estimated_bytes} bytes, more than the original's {original.estimated_bytes}", probe
    return None, probe


# ---------------------------------------------------------------------------------------------------------
# Manifests


def manifest_json(task: Task, generation: Generation) -> dict:
    data = {"task": task.name, "level": task.level, "sha256": task.sha256, "rule": RULE,
            "shapes": [shape.to_json() for shape in generation.shapes]}
    if not generation.shapes:
        data["reason"] = generation.reason
    return data


def write_manifest(task: Task, generation: Generation, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest_json(task, generation), indent=2) + "\n"
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(text)
    temporary.replace(path)  # a reader never sees half a manifest
    return path


def _manifest_path(task: Task, out_dir: Path, root: Path | None) -> Path:
    if root is not None and task.path is not None:
        with contextlib.suppress(ValueError):
            return out_dir / Path(task.path).resolve().relative_to(root.resolve()).with_suffix(".json")
    level = f"level{task.level}" if task.level is not None else ""
    return out_dir / level / f"{task.name}.json"


def write_manifests(tasks: Sequence[Task], out_dir: str | Path, *, root: str | Path | None = None) -> list[Path]:
    """Generate and write one manifest per task: `out_dir/levelL/<name>.json`, or mirroring the task's
    path below `root` when given."""
    out_dir = Path(out_dir)
    root = Path(root) if root is not None else None
    return [write_manifest(task, _generate(task), _manifest_path(task, out_dir, root)) for task in tasks]


def load_manifest(task: Task, hidden_dir: str | Path) -> list[HiddenShape] | None:
    """The committed hidden shapes for exactly this task (same name and sha256) under `hidden_dir`, or None.

    A manifest written for another version of the file does not apply."""
    hidden_dir = Path(hidden_dir)
    if not hidden_dir.is_dir():
        return None
    # By content first: a published run names its tasks its own way ("9_level1"), but its reference source is
    # the file the manifest was made from, byte for byte.
    files = sorted(hidden_dir.rglob("*.json"))
    signature = tuple((str(path), path.stat().st_mtime_ns) for path in files)
    candidates = _manifests_by_sha256(signature).get(task.sha256, ())
    for path in sorted(candidates, key=lambda found: Path(found).stem != task.name):  # its own name first
        data = _read_manifest(Path(path))
        if data.get("sha256") == task.sha256:
            return _shapes_of(Path(path), data)
    for path in files:
        if path.stem != task.name:
            continue
        data = _read_manifest(path)
        if data.get("task") == task.name and data.get("sha256") == task.sha256:
            return _shapes_of(path, data)
    return None


def _shapes_of(path: Path, data: dict) -> list[HiddenShape]:
    try:
        return [HiddenShape.from_json(shape) for shape in data.get("shapes", [])]
    except (KeyError, TypeError, AttributeError) as error:
        raise InputError(f"{path}: malformed hidden shape: {describe(error)}") from None


@lru_cache(maxsize=16)
def _manifests_by_sha256(files: tuple[tuple[str, int], ...]) -> dict[str, tuple[str, ...]]:
    """Content hash → manifest files, for the files as they are now (path and modification time key the cache).
    Only real manifests count: a task name, a rule, a hash and a list of shapes."""
    index: dict[str, list[str]] = {}
    for path, _ in files:
        try:
            data = _read_manifest(Path(path))
        except InputError:
            continue  # named in the error when a lookup by name reaches it
        if (isinstance(data.get("sha256"), str) and isinstance(data.get("task"), str) and "rule" in data
                and isinstance(data.get("shapes"), list)):
            index.setdefault(data["sha256"], []).append(path)
    return {sha: tuple(paths) for sha, paths in index.items()}


def _read_manifest(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: unreadable hidden-shape manifest: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("shapes", []), list):
        raise InputError(f"{path}: not a hidden-shape manifest")
    return data


def committed_shapes(task: Task, hidden_dirs: Sequence[str | Path]) -> list[HiddenShape] | None:
    """The first committed manifest for this task among `hidden_dirs`; None where none applies."""
    for hidden_dir in hidden_dirs:
        shapes = load_manifest(task, hidden_dir)
        if shapes is not None:
            return shapes
    return None


def shapes_for(task: Task, hidden_dirs: Sequence[str | Path]) -> tuple[list[HiddenShape], str]:
    """The task's hidden shapes and their origin: "committed", "generated" or "none"."""
    shapes = committed_shapes(task, hidden_dirs)
    if shapes is not None:
        return shapes, "committed" if shapes else "none"
    shapes = list(_generated(task))
    return shapes, "generated" if shapes else "none"


@lru_cache(maxsize=64)
def _generated(task: Task) -> tuple[HiddenShape, ...]:
    # Several protocols ask for the same task's shapes in one run; the rule is deterministic.
    return tuple(generate_hidden_shapes(task))


def execute_with_shape(task: Task, shape: HiddenShape | None) -> dict:
    """The task's namespace with the shape's constants in force (None: the task as written)."""
    if shape is None:
        return execute_task(task)
    return execute_source(task, rewrite_constants(task.source, shape.overrides))


# ---------------------------------------------------------------------------------------------------------
# `kbverify hidden generate TASKS --out DIR`


def generate_command(tasks_path: str | Path, out_dir: str | Path, *, jobs: int = 1) -> dict:
    """Write a manifest for every task under `tasks_path`, mirroring its folders under `out_dir`."""
    tasks_path, out_dir = Path(tasks_path), Path(out_dir)
    tasks = load_task_dir(tasks_path)
    root = tasks_path if tasks_path.is_dir() else tasks_path.parent
    started = time.perf_counter()
    by_count: dict[int, int] = {}
    failures: list[str] = []
    for index, (task, generation) in enumerate(_generations(tasks, jobs), start=1):
        if isinstance(generation, str):
            failures.append(task.key)
            log.error("[%d/%d] %s: generation failed: %s", index, len(tasks), task.key, generation)
            continue
        write_manifest(task, generation, _manifest_path(task, out_dir, root))
        by_count[len(generation.shapes)] = by_count.get(len(generation.shapes), 0) + 1
        detail = ", ".join(f"{s.kind} ({s.validation})" for s in generation.shapes) or generation.reason
        log.info("[%d/%d] %s: %d hidden shape(s) in %.1f s: %s", index, len(tasks), task.key,
                 len(generation.shapes), generation.duration_s, detail)
    with_shapes = sum(count for n, count in by_count.items() if n > 0)
    return {"tasks": len(tasks), "committed": with_shapes, "none": by_count.get(0, 0), "failures": len(failures),
            "failed_tasks": failures, "by_count": {str(n): by_count[n] for n in sorted(by_count)},
            "rule": RULE, "out": str(out_dir), "duration_s": round(time.perf_counter() - started, 1)}


def _generations(tasks: list[Task], jobs: int) -> Iterable[tuple[Task, Generation | str]]:
    if jobs <= 1:
        for task in tasks:
            yield task, _generate_or_error(task)
        return
    import concurrent.futures
    import multiprocessing

    # spawn, not fork: forking a process that already ran torch ops can deadlock its thread pools.
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from zip(tasks, pool.map(_generate_or_error, tasks))


def _generate_or_error(task: Task) -> Generation | str:
    try:
        return _generate(task)
    except Exception as error:  # noqa: BLE001 - one broken task must not stop the others
        log.debug("generation failed for %s", task.key, exc_info=True)
        return describe(error)

