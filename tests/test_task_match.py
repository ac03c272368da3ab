"""Does a tasks folder fit the source it is given for (`kbverify.rescore.task_match`): found tasks, and kernels whose
ModelNew can take what the task gives Model, read from the sources alone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kbverify.core.errors import InputError
from kbverify.rescore.importers import load_entries
from kbverify.rescore.task_match import call_misfit, require_tasks_fit

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "examples" / "published_run"

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    a = torch.rand(4, 4)
    return [a, torch.rand(4, 4)]


def get_init_inputs():
    return [4]
'''


def kernel(init: str = "self, dim", forward: str = "self, a, b") -> str:
    return (f"import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__({init}):\n"
            f"        super().__init__()\n\n    def forward({forward}):\n        return a\n")


@pytest.mark.parametrize("init, forward, misfit", [
    ("self, dim", "self, a, b", None),
    ("self, dim, eps=1e-5", "self, *inputs", None),
    ("self, *args", "self, a, b, c=None", None),
    ("self", "self, a, b", "ModelNew.__init__ takes 0 constructor arguments, the task gives 1"),
    ("self, dim", "self, x", "ModelNew.forward takes 1 inputs, the task gives 2"),
    ("self, dim", "self, a, b, c", "ModelNew.forward takes 3 inputs, the task gives 2"),
    ("self, dim, *, scale", "self, a, b", None),  # a required keyword-only argument: cannot be told
])
def test_a_kernel_fits_its_task_when_it_can_take_its_arguments(init, forward, misfit):
    assert (call_misfit(TASK, kernel(init, forward)) or None) == misfit


def test_without_a_literal_list_the_tasks_own_signature_decides():
    looped = TASK.replace("return [a, torch.rand(4, 4)]", "return [a] * 2")
    assert call_misfit(looped, kernel(forward="self, a, b")) is None
    assert "the task gives 2" in call_misfit(looped, kernel(forward="self, a"))


def test_sources_that_do_not_tell_are_never_misfits():
    assert call_misfit(TASK, "class ModelNew(Model):\n    pass\n") == ""
    assert call_misfit(TASK, "def broken(:\n") == ""
    assert call_misfit("x = 1\n", kernel()) == ""


def test_the_bundled_run_fits_its_own_tasks_and_no_other_folder(caplog):
    entries = load_entries(RUN, tasks_dir=REPO / "tasks" / "basic")
    with caplog.at_level(logging.WARNING):
        match = require_tasks_fit(entries, fmt="kernelbench", source=RUN, tasks_dir=REPO / "tasks" / "basic")
    assert (match.named, match.found, match.checked, match.misfits) == (11, 11, 12, ())
    assert not caplog.records
    for folder, message in (("tasks", r"0 of the 11 tasks the source names were found .*tasks/basic holds 11"),
                            ("tasks/gpu", "8 of 11 kernels cannot take the inputs"),
                            ("tasks/degenerate", "5 of 7 kernels cannot take the inputs")):
        with pytest.raises(InputError, match=message):
            require_tasks_fit(load_entries(RUN, tasks_dir=REPO / folder), fmt="kernelbench", source=RUN,
                              tasks_dir=REPO / folder)


def test_a_folder_holding_most_of_the_tasks_is_taken_with_a_warning(tmp_path, caplog):
    tasks = tmp_path / "tasks" / "level1"
    tasks.mkdir(parents=True)
    for name in ("1_ReLU", "2_Square_matrix_multiplication_", "4_LayerNorm"):
        (tasks / f"{name}.py").write_text((REPO / "tasks" / "basic" / "level1" / f"{name}.py").read_text())
    run = tmp_path / "run"
    run.mkdir()
    for problem in (1, 2, 4, 5):
        (run / f"level_1_problem_{problem}_sample_0_kernel.py").write_text((RUN / f"level_1_problem_{problem}_"
                                                                            f"sample_0_kernel.py").read_text())
    entries = load_entries(run, tasks_dir=tmp_path / "tasks")
    with caplog.at_level(logging.WARNING):
        match = require_tasks_fit(entries, fmt="kernelbench", source=run, tasks_dir=tmp_path / "tasks")
    assert (match.named, match.found, match.missing) == (4, 3, ("level1/5",))
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "1 of the 4 tasks the source names were not found (e.g. level1/5)" in warning
    for name in ("4_LayerNorm", "2_Square_matrix_multiplication_"):  # half found is enough; fewer is refused
        (tasks / f"{name}.py").unlink()
    with pytest.raises(InputError, match=r"1 of the 4 tasks the source names were found \(missing e\.g\. level1/2, "
                                         r"level1/4, level1/5\)"):
        require_tasks_fit(load_entries(run, tasks_dir=tmp_path / "tasks"), fmt="kernelbench", source=run,
                          tasks_dir=tmp_path / "tasks")
