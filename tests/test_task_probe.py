"""A task that cannot run by itself is the task's problem (`kbverify.harness.task_probe`), never a verdict on a kernel:
`check` ends with exit 2 naming the task, `rescore` stores `unverifiable` with the task's error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kbverify.core.errors import InfrastructureError, TaskError
from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import parse_task
from kbverify.harness import sandbox, task_probe
from kbverify.harness.runner import CheckOptions
from kbverify.harness.sandbox import ChildOutcome

REPO = Path(__file__).resolve().parent.parent
TASK_SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(8, 8)]


def get_init_inputs():
    return []
'''
HONEST = ("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
          "        return x.clamp_min(0)\n")
TASK = parse_task(TASK_SOURCE, name="1_ReLU", level=1, problem_id=1, path="tasks/level1/1_ReLU.py")
SUBMISSION = make_submission(HONEST, id="relu.py")
OPTIONS = CheckOptions(device="cpu", timeout_s=30.0)


def outcome(result=None, *, timed_out=False) -> ChildOutcome:
    return ChildOutcome(result=result, exit_code=0 if result is not None else -9, timed_out=timed_out,
                        last_phase="candidate:build", output_head="", output_tail="", output_bytes=0, wall_s=0.1)


@pytest.fixture
def probes(monkeypatch):
    """The probe's worker, faked: `probes.append(outcome)` decides what the next probe reports."""
    task_probe._known.clear()
    queued, asked = [], []

    def run_child(job, payload, **kwargs):
        asked.append((job, payload))
        assert job == "build" and payload["task_source"] == TASK_SOURCE and payload["submission_source"]
        return queued.pop(0)

    monkeypatch.setattr(sandbox, "run_child", run_child)
    yield queued, asked
    task_probe._known.clear()


def verdict(status: Status) -> Verdict:
    return Verdict(task=TASK.key, task_name=TASK.name, level=1, problem_id=1, submission="relu.py",
                   submission_sha256=SUBMISSION.sha256, protocol="original", protocol_sha256="0" * 64, status=status)


def checking(result):
    def check(task, submission, protocol, options, **fields):
        if isinstance(result, Exception):
            raise result
        return result
    return check


def test_a_passing_kernel_costs_no_probe(probes):
    queued, asked = probes
    assert task_probe.judge(checking(verdict(Status.PASSED)), TASK, SUBMISSION, None, OPTIONS).correct
    assert task_probe.judge(checking(verdict(Status.INCORRECT)), TASK, SUBMISSION, None, OPTIONS).status is \
        Status.INCORRECT
    assert asked == []


def test_a_failing_kernel_of_a_sound_task_keeps_its_verdict(probes):
    queued, asked = probes
    queued.append(outcome({"ok": True, "error": ""}))
    for status in (Status.RUNTIME_ERROR, Status.CRASHED):
        assert task_probe.judge(checking(verdict(status)), TASK, SUBMISSION, None, OPTIONS).status is status
    assert len(asked) == 1  # once per task and device


@pytest.mark.parametrize("status", sorted(task_probe.SUSPECT, key=lambda s: s.value))
def test_a_task_that_fails_alone_is_named_instead_of_the_kernel(probes, status):
    queued, _ = probes
    queued.append(outcome({"ok": False, "error": "ValueError: no inputs today"}))
    with pytest.raises(TaskError, match=r"task 1_ReLU \(tasks/level1/1_ReLU\.py\) cannot run by itself: "
                                        r"ValueError: no inputs today; no submission was judged") as raised:
        task_probe.judge(checking(verdict(status)), TASK, SUBMISSION, None, OPTIONS)
    assert raised.value.exit_code == 2


def test_a_worker_error_the_task_explains_is_the_tasks(probes):
    queued, _ = probes
    queued.append(outcome({"ok": False, "error": "RuntimeError: exploded at import"}))
    with pytest.raises(TaskError, match="exploded at import"):
        task_probe.judge(checking(InfrastructureError("candidate worker failed: RuntimeError: exploded at import")),
                         TASK, SUBMISSION, None, OPTIONS)
    task_probe._known.clear()
    queued.append(outcome({"ok": True}))
    with pytest.raises(InfrastructureError, match="no GPU"):
        task_probe.judge(checking(InfrastructureError("no GPU")), TASK, SUBMISSION, None, OPTIONS)


@pytest.mark.parametrize("probe, blamed", [
    (outcome(None), None),  # the probe died: cannot tell
    (outcome({"infrastructure_error": "OSError: no space"}), None),
    (outcome({"ok": False, "error": "RuntimeError: CUDA error: an illegal memory access"}), None),
    (outcome(None, timed_out=True), "did not load and run one forward within the 30 s"),
    (outcome({"ok": False, "error": "Traceback...\nKeyError: 'dim'"}), "KeyError: 'dim'"),
])
def test_only_the_tasks_own_failure_is_blamed_on_it(probes, probe, blamed):
    queued, _ = probes
    queued.append(probe)
    reason = task_probe.task_failure(TASK, OPTIONS)
    assert (reason is None) if blamed is None else (blamed in reason)


def test_rescore_stores_a_broken_tasks_unit_as_unverifiable(probes, monkeypatch):
    from kbverify.core.protocols import ORIGINAL
    from kbverify.rescore import rescore
    from kbverify.rescore.importers import Entry

    queued, _ = probes
    queued.append(outcome({"ok": False, "error": "ValueError: no inputs today"}))
    monkeypatch.setattr(rescore, "check", checking(verdict(Status.RUNTIME_ERROR)))
    entry = Entry(entry_id="level1/1/s0", task=TASK, submission=SUBMISSION, level=1, problem_id=1, sample=0,
                  claimed_speedup=3.0, unverifiable=None, reference_origin="tasks_dir", modified_reference=None)
    stored = rescore.evaluate_unit(rescore.Unit("k", entry, ORIGINAL), OPTIONS)
    assert stored.status is Status.UNVERIFIABLE and stored.claimed_speedup == 3.0
    assert stored.message.startswith("task 1_ReLU") and "no inputs today" in stored.message


# --- end to end, with real workers (a few seconds each) ---------------------------------------------------------

@pytest.mark.parametrize("where, protocol", [("import", "verified"), ("get_inputs", "original")])
def test_check_names_a_task_that_cannot_run_and_exits_2(tmp_path, where, protocol):
    broken = {"import": TASK_SOURCE.replace("class Model", "raise RuntimeError('exploded at import')\n\n\nclass Model"),
              "get_inputs": TASK_SOURCE.replace("return [torch.rand(8, 8)]", "raise ValueError('no inputs today')")}
    task = tmp_path / "level1" / "1_Broken.py"
    task.parent.mkdir()
    task.write_text(broken[where])
    submission = tmp_path / "relu.py"
    submission.write_text(HONEST)
    protocol_args = ["--protocol", protocol] if protocol == "original" else [
        "--protocol", str(_fast_verified(tmp_path))]
    result = subprocess.run([sys.executable, "-m", "kbverify", "check", str(submission), "--task", str(task),
                             *protocol_args, "--device", "cpu", "--timeout", "60", "--json"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stdout[-1000:], result.stderr[-2000:])
    assert result.stdout == "" and "Traceback" not in result.stderr
    # progress lines may come first (in a log, `check` says what it is doing); the error is one line, the last
    *progress, line = result.stderr.splitlines()
    assert all(not row.startswith("kbverify:") for row in progress), progress
    assert line.startswith("kbverify: task 1_Broken") and "cannot run by itself" in line
    assert ("exploded at import" if where == "import" else "no inputs today") in line


def _fast_verified(root: Path) -> Path:
    path = root / "verified.json"
    path.write_text('{"base": "verified", "name": "verified", "timing_budget_s": 0.2, "as_user_set": false}')
    return path
