"""Hidden shapes larger than the task's, and a value that is no power of two for every shape constant.

The rule's first kinds (kbverify.shapes.hidden: smaller, odd) never leave the task's sizes upward, so a kernel that reads
only the first rows of an axis, or has a fixed bound on a loop, a tile or a buffer, is never tried on what it
skips (corpus: exploits/row_sum_reads_only_the_first_64_rows). Two more kinds:

  larger  every shape constant ×2, all at once; where that does not validate or needs more memory than
          `peak_budget` allows (the reference's peak of live tensors on meta, `meta_probe.PeakCounter`, times
          `LARGER_PEAK_FACTOR`, never above `LARGER_MAX_PEAK_BYTES`), greedy groups: batch-like constants first,
          each constant ×2 added while the group validates, a new group for the rest, at most `MAX_LARGER`
          groups. A constant no group could grow is kept at the task's size: the first larger shape (the first
          hidden shape where there is none) names the kept ones and why (`HiddenShape.kept`), and the verdict
          repeats it.
  npot    for each shape constant whose values (the task's and every hidden shape's) are all powers of two, one
          shape that moves it alone to a value that is not (n-1, or 3 for 2), at most `MAX_NPOT` of them: a
          kernel that tiles by a power of two and drops the tail meets a size it does not divide.
"""

from __future__ import annotations

from kbverify.shapes.meta_probe import Probe, validate
from kbverify.shapes.task_constants import rewrite_constants

LARGER_PEAK_FACTOR = 8  # the larger shape may hold this many times the task's own peak (×2 on three axes)
LARGER_MAX_PEAK_BYTES = 4 << 30  # and never more: the judge's and the candidate's processes hold one each
MAX_LARGER = 2
MAX_NPOT = 2


def peak_budget(original: Probe) -> int | None:
    """The most bytes a larger shape's reference may hold at once, or None where the task's own peak is unknown
    (then only an all-at-once ×2 within `LARGER_MAX_PEAK_BYTES` is tried)."""
    own = original.peak_bytes or original.estimated_bytes
    if own is None:
        return None
    return min(own * LARGER_PEAK_FACTOR, max(own, LARGER_MAX_PEAK_BYTES))


def _check(task, overrides: dict, original: Probe, budget: int | None) -> tuple[str | None, Probe]:
    probe = validate(task, rewrite_constants(task.source, overrides))
    if probe.validation is None:
        return probe.error, probe
    if probe.input_shapes == original.input_shapes:
        return "input shapes unchanged", probe
    held = probe.peak_bytes or probe.estimated_bytes
    limit = budget if budget is not None else LARGER_MAX_PEAK_BYTES
    if held is not None and held > limit:
        return f"memory: needs {held} bytes at its peak, more than the bound of {limit}", probe
    return None, probe


def _doubled(value):
    return tuple(2 * v for v in value) if isinstance(value, tuple) else 2 * value


def larger_shapes(task, constants: list, original: Probe, shape_class) -> tuple[list, dict]:
    """The larger hidden shapes (labels left empty), and the constants none of them grows: name → why."""
    budget = peak_budget(original)
    everything = {c.name: _doubled(c.value) for c in constants}
    problem, probe = _check(task, everything, original, budget)
    if problem is None:
        return [shape_class(label="", overrides=everything, input_shapes=probe.input_shapes,
                            validation=probe.validation, kind="larger/all")], {}
    remaining = sorted(constants, key=lambda c: not c.batch_like)
    why: dict[str, str] = {}
    groups: list[tuple[dict, Probe]] = []
    while remaining and len(groups) < MAX_LARGER:
        group, group_probe, rest = {}, None, []
        for constant in remaining:
            trial = {**group, constant.name: _doubled(constant.value)}
            problem, probe = _check(task, trial, original, budget)
            if problem is None:
                group, group_probe = trial, probe
            else:
                why[constant.name], rest = problem[:200], rest + [constant]
        if not group:
            break
        groups.append((group, group_probe))
        remaining = rest
    kept = {c.name: why.get(c.name, "no group left") for c in remaining}
    return [shape_class(label="", overrides=group, input_shapes=probe.input_shapes, validation=probe.validation,
                        kind="larger/greedy") for group, probe in groups], kept


def _power_of_two(value) -> bool:
    """1 counts (2⁰): a kernel that tiles by a power of two divides it as well as any other."""
    values = value if isinstance(value, tuple) else (value,)
    return all(v >= 1 and v & (v - 1) == 0 for v in values)


def _tileable(value) -> bool:
    return all(v >= 2 for v in (value if isinstance(value, tuple) else (value,)))


def _npot(value):
    step = lambda v: 3 if v == 2 else v - 1
    return tuple(step(v) for v in value) if isinstance(value, tuple) else step(value)


def npot_shapes(task, constants: list, original: Probe, found: list, shape_class) -> list:
    """One shape per shape constant that every configuration so far leaves a power of two (see module doc)."""
    shapes = []
    for constant in constants:
        if len(shapes) >= MAX_NPOT:
            break
        seen = [constant.value] + [shape.overrides[constant.name] for shape in found
                                   if constant.name in shape.overrides]
        if not _tileable(constant.value) or not all(_power_of_two(value) for value in seen):
            continue
        overrides = {constant.name: _npot(constant.value)}
        problem, probe = _check(task, overrides, original, peak_budget(original))
        if problem is None:
            shapes.append(shape_class(label="", overrides=overrides, input_shapes=probe.input_shapes,
                                      validation=probe.validation, kind="npot/one"))
    return shapes
