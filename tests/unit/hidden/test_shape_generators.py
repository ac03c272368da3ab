"""Properties of the hidden-shape rule (kbverify.shapes.hidden, kbverify.shapes.hidden_larger) on generated tasks and on the
committed manifests of tasks/: every shape runs the task's own Model; every axis that can grow has a shape larger
than the task's, or is named as kept with its reason; every shape constant that is a power of two meets a value
that is not. Corpus: exploits/row_sum_reads_only_the_first_64_rows, honest/row_sum_in_blocks_of_64_rows."""

import json
from pathlib import Path

import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kbverify.core.tasks import Task, execute_task, load_task_dir, parse_task
from kbverify.shapes.hidden import _shape_constants, generate_hidden_shapes, rewrite_constants
from kbverify.shapes.meta_probe import validate

ROOT = Path(__file__).resolve().parents[3]
TEMPLATES = {
    "sum": ("class Model(nn.Module):\n    def forward(self, x):\n        return x.sum(dim=1)\n\n",
            "def get_inputs():\n    return [torch.rand(batch_size, dim1, dim2)]\n\n\n"
            "def get_init_inputs():\n    return []\n"),
    "linear": ("class Model(nn.Module):\n    def __init__(self, i, o):\n        super().__init__()\n"
               "        self.fc = nn.Linear(i, o)\n\n    def forward(self, x):\n        return self.fc(x)\n\n",
               "def get_inputs():\n    return [torch.rand(batch_size, dim2)]\n\n\n"
               "def get_init_inputs():\n    return [dim2, dim1]\n"),
}


def _task(kind: str, batch: int, dim1: int, dim2: int) -> Task:
    model, tail = TEMPLATES[kind]
    source = (f"import torch\nimport torch.nn as nn\n\n\n{model}\nbatch_size = {batch}\ndim1 = {dim1}\n"
              f"dim2 = {dim2}\n\n\n{tail}")
    return parse_task(source, name=f"1_{kind}")


def _runs(task: Task, overrides: dict) -> bool:
    namespace = execute_task(parse_task(rewrite_constants(task.source, overrides), name=task.name))
    torch.manual_seed(0)
    with torch.no_grad():
        out = namespace["Model"](*namespace["get_init_inputs"]())(*namespace["get_inputs"]())
    return bool(torch.isfinite(out).all())


def _grown_or_kept(shapes, name: str, value) -> bool:
    larger = lambda v: (v > value) if isinstance(v, int) else all(a > b for a, b in zip(v, value))
    return any(larger(s.overrides[name]) for s in shapes if name in s.overrides) \
        or any(name in s.kept for s in shapes)


def _powers_of_two(value) -> bool:
    return all(v >= 1 and v & (v - 1) == 0 for v in (value if isinstance(value, tuple) else (value,)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(TEMPLATES)), batch=st.integers(1, 48),
       dim1=st.sampled_from([1, 2, 3, 16, 64, 100]), dim2=st.sampled_from([2, 8, 32, 48, 128]))
@example(kind="sum", batch=2, dim1=2, dim2=8)  # 2 stays 2 under "odd" and doubles to 4: a power of two each time
def test_every_shape_runs_and_every_axis_grows_or_is_kept(kind, batch, dim1, dim2):
    task = _task(kind, batch, dim1, dim2)
    original = validate(task, task.source)
    assert original.validation is not None, original.error
    shapes = generate_hidden_shapes(task)
    for shape in shapes:
        assert _runs(task, shape.overrides), shape
    constants = _shape_constants(task, original)
    for constant in constants:
        assert _grown_or_kept(shapes, constant.name, constant.value), (constant, shapes)
        if _powers_of_two(constant.value) and constant.value != 1:
            seen = [s.overrides[constant.name] for s in shapes if constant.name in s.overrides]
            assert any(not _powers_of_two(v) for v in seen), (constant, shapes)


def test_the_committed_manifests_of_tasks_grow_every_axis_they_move_or_name_it_kept():
    for task in load_task_dir(ROOT / "tasks"):
        path = ROOT / "hidden_tests" / "tasks" / Path(task.path).resolve().relative_to(ROOT / "tasks")
        data = json.loads(path.with_suffix(".json").read_text())
        assert data["sha256"] == task.sha256 and data["rule"].startswith("kbverify-hidden/2"), task.name
        from kbverify.shapes.hidden import HiddenShape

        shapes = [HiddenShape.from_json(s) for s in data["shapes"]]
        moved = {name for s in shapes for name in s.overrides}
        namespace = execute_task(task)
        for name in moved:
            assert _grown_or_kept(shapes, name, namespace[name]), (task.name, name)
