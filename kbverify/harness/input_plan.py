"""The input sets one check draws: the protocol's distributions and weights over the task's own shape and its
hidden shapes, and which of them its timing draws. Planning only: nothing here decides a status."""

from __future__ import annotations

import logging

from kbverify.core.inputs import InputSet, plan_input_sets
from kbverify.core.protocols import Protocol
from kbverify.core.tasks import Task
from kbverify.harness.sandbox import run_child

log = logging.getLogger(__name__)

_GENERATED_SHAPES: dict[str, list] = {}


def hidden_shapes_for(task: Task, hidden_dirs, device: str = "cpu") -> tuple[list, str]:
    """Committed manifests are read here; shapes for a task without one are generated in a worker, because
    generating executes the task's code and a published run's reference is untrusted (SPEC §7)."""
    from kbverify.shapes import hidden

    shapes = hidden.committed_shapes(task, hidden_dirs)
    if shapes is not None:
        return shapes, "committed" if shapes else "none"
    if task.sha256 not in _GENERATED_SHAPES:
        outcome = run_child("hidden", {"task_source": task.source, "task_name": task.name, "device": "cpu"},
                            timeout_s=300, device="cpu")
        result = outcome.result or {}
        if "shapes" not in result:
            log.warning("hidden shapes for %s could not be generated: %s", task.name,
                        result.get("infrastructure_error") or outcome.output_tail[-300:])
        _GENERATED_SHAPES[task.sha256] = [hidden.HiddenShape.from_json(s) for s in result.get("shapes", [])]
    shapes = _GENERATED_SHAPES[task.sha256]
    return shapes, "generated" if shapes else "none"


def _shapes(task: Task, protocol: Protocol, hidden_dirs) -> tuple[list[tuple[str, dict]], str]:
    shapes: list[tuple[str, dict]] = [("original", {})]
    if not protocol.hidden_shapes:
        return shapes, "none"
    hidden_shapes, origin = hidden_shapes_for(task, list(hidden_dirs))
    shapes += [(shape.label, dict(shape.overrides)) for shape in hidden_shapes]
    return shapes, origin


def plan_for(task: Task, protocol: Protocol, *, hidden_dirs, only: str | None,
             secret: str) -> tuple[list[InputSet], str]:
    """The sets, and where the hidden shapes came from ("committed", "generated" or "none"). `only`: a set id,
    or a prefix of set ids, to draw alone."""
    shapes, origin = _shapes(task, protocol, hidden_dirs)
    plan = plan_input_sets(protocol, shapes, secret=secret)
    if only:
        plan = [s for s in plan if s.set_id == only or s.set_id.startswith(only)]
    return plan, origin


def kept_axes_note(task: Task, protocol: Protocol, hidden_dirs) -> str:
    """Which axes that can grow the larger hidden shapes kept at the task's size, and why, in one sentence for
    the verdict ("" where none was kept, or the protocol has no hidden shapes)."""
    if not protocol.hidden_shapes:
        return ""
    kept: dict = {}
    for shape in hidden_shapes_for(task, list(hidden_dirs))[0]:
        kept.update(shape.kept)
    if not kept:
        return ""
    return "larger hidden shapes keep " + "; ".join(f"{name} at the task's size ({why})" for name, why in kept.items())


def timed_distributions(sets, protocol: Protocol) -> list[str]:
    """The distributions the timed rounds draw in turn: the protocol's, each where the task's own shapes had a
    valid set (a distribution on which the reference itself goes non-finite, a KL divergence on negated inputs,
    is invalid for the task: timing on it would compare NaN with NaN). x1 when none is known."""
    valid = {s.distribution for s in sets if s.valid and s.shape == "original"}
    return [d for d in protocol.distributions if d in valid] or ["x1"]
