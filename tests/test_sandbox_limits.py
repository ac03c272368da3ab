"""What a sandboxed job may take of the machine: its private tmpfs folders are bounded (KBVERIFY_TMPFS_SIZE), and
filling them is the candidate's failure, never the machine's. Skipped, and said, where isolation is unavailable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kbverify.harness import confine
from kbverify.harness.sandbox import run_child

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

FILL = """
import errno, json, os
found = {{}}
for folder in ("/tmp", "/var/tmp", "/dev/shm"):
    stat = os.statvfs(folder)
    written, error = 0, None
    try:
        with open(os.path.join(folder, "fill"), "wb") as handle:
            while written < {cap}:
                handle.write(b"x" * (1 << 20))
                handle.flush()
                written += 1 << 20
    except OSError as exc:
        error = errno.errorcode.get(exc.errno)
    os.remove(os.path.join(folder, "fill"))
    found[folder] = {{"total": stat.f_blocks * stat.f_frsize, "written": written, "error": error}}
raise RuntimeError("FOUND" + json.dumps(found))
"""


def _found(outcome) -> dict:
    if outcome.isolation != "isolated":
        pytest.skip(f"isolation unavailable here: {outcome.isolation} ({outcome.isolation_reason})")
    error = outcome.result["error"]
    return json.loads(error[error.index("FOUND") + 5:])


def test_the_private_tmpfs_folders_are_bounded_by_default():
    expected = int(confine.tmpfs_size())
    assert 64 * MiB <= expected <= confine.TMPFS_DEFAULT_CAP
    outcome = run_child("build", {"submission_source": FILL.format(cap=0), "device": "cpu"}, timeout_s=60)
    for folder, seen in _found(outcome).items():
        assert seen["total"] == expected, (folder, seen)


def test_the_scratch_home_and_gettempdir_are_bounded_too(monkeypatch):
    # cwd, HOME and TMPDIR are the job's scratch: a private tmpfs of the same bound, not the host's disk
    monkeypatch.setenv(confine.TMPFS_SIZE_ENV, "24m")
    source = FILL.format(cap=256 * MiB).replace('("/tmp", "/var/tmp", "/dev/shm")',
                                                '(os.getcwd(), os.environ["HOME"], __import__("tempfile").gettempdir())')
    outcome = run_child("build", {"submission_source": source, "device": "cpu"}, timeout_s=60)
    for folder, seen in _found(outcome).items():
        assert seen["error"] == "ENOSPC" and seen["written"] <= 24 * MiB, (folder, seen)


def test_a_build_folder_over_its_bound_is_emptied_and_the_job_blamed(monkeypatch, tmp_path):
    from kbverify.harness import disk_bound

    monkeypatch.setenv(disk_bound.LIMIT_ENV, str(2 * MiB))
    build = tmp_path / "build"
    source = ("import os\nwith open(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'pad.bin'), 'wb') as f:\n"
              "    f.write(os.urandom(6 << 20))\n")
    outcome = run_child("build", {"submission_source": source, "device": "cpu"}, timeout_s=60,
                        env={"TORCH_EXTENSIONS_DIR": str(build)})
    assert outcome.died and "bound" in outcome.build_dir_over, outcome
    assert build.is_dir() and not any(build.iterdir())


def test_filling_a_tmpfs_stops_at_its_bound(monkeypatch):
    monkeypatch.setenv(confine.TMPFS_SIZE_ENV, "24m")
    outcome = run_child("build", {"submission_source": FILL.format(cap=256 * MiB), "device": "cpu"}, timeout_s=60)
    for folder, seen in _found(outcome).items():
        assert seen["error"] == "ENOSPC" and seen["written"] <= 24 * MiB, (folder, seen)


FILLS_TMP_IN_FORWARD = """
import os
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        # a scratch file in /tmp: {size} MiB of it on every call
        with open("/tmp/scratch.bin", "wb") as handle:
            for _ in range({size}):
                handle.write(b"\\0" * (1 << 20))
        return torch.relu(x)
"""


@pytest.mark.parametrize("size, expected", [(64, "runtime_error"), (2, "passed")])
def test_a_kernel_that_fills_its_tmp_fails_on_its_own_account(monkeypatch, size, expected):
    """Past the bound, the forward's write fails (ENOSPC) and the verdict is the candidate's; the same kernel
    writing a little passes (its honest twin)."""
    from kbverify.core.protocols import VERIFIED
    from kbverify.core.submissions import make_submission
    from kbverify.core.tasks import load_task
    from kbverify.harness.runner import CheckOptions, check

    monkeypatch.setenv(confine.TMPFS_SIZE_ENV, "32m")
    probe = run_child("build", {"submission_source": "x = 1\n", "device": "cpu"}, timeout_s=60)
    if probe.isolation != "isolated":
        pytest.skip(f"isolation unavailable here: {probe.isolation} ({probe.isolation_reason})")
    source = FILLS_TMP_IN_FORWARD.format(size=size)
    submission = make_submission(source, id=f"fills_{size}")
    verdict = check(load_task(REPO / "tasks/basic/level1/1_ReLU.py"), submission,
                    VERIFIED.with_overrides(timing_budget_s=0.3), CheckOptions(device="cpu", timeout_s=120.0))
    assert verdict.status.value == expected, verdict.message[:300]
    if expected != "passed":
        assert "No space left on device" in verdict.message


@pytest.mark.parametrize("value", ["0", "lots", "-1g", "150%", "2t"])
def test_a_bad_tmpfs_size_is_bad_input(monkeypatch, value):
    monkeypatch.setenv(confine.TMPFS_SIZE_ENV, value)
    with pytest.raises(ValueError, match=confine.TMPFS_SIZE_ENV):
        confine.tmpfs_size()


def test_a_bad_tmpfs_size_ends_check_with_exit_2_and_one_line(tmp_path):
    submission = tmp_path / "k.py"
    submission.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                          "        return torch.relu(x)\n")
    done = subprocess.run([sys.executable, "-m", "kbverify", "check", str(submission), "--task",
                           str(REPO / "tasks/basic/level1/1_ReLU.py")], capture_output=True, text=True,
                          env={**os.environ, confine.TMPFS_SIZE_ENV: "lots"}, cwd=REPO, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and confine.TMPFS_SIZE_ENV in lines[0] and "Traceback" not in done.stderr
