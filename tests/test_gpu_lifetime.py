"""Issue 21 on a GPU: `kbverify check` killed with SIGKILL while a CUDA kernel of the submission spins leaves no
process of its own on the device within 5 s, and the next check's A/A is what it was before.

Run on a machine with a GPU, nvcc and nvidia-smi: `python3 -m pytest tests/test_gpu_lifetime.py -m gpu -s`.
With `KBVERIFY_GPU_RESULTS=path.jsonl` the numbers are appended there as one JSON line.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kbverify.core.protocols import VERIFIED
from kbverify.core.submissions import make_submission
from kbverify.core.tasks import load_task
from kbverify.harness import gpu_processes
from kbverify.harness.runner import CheckOptions, check

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "tasks" / "gpu" / "level1" / "2_ReLU_16x16384.py"
DEVICE = "cuda:0"
GONE_WITHIN_S = 5.0

SPINS = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>

__global__ void spin_kernel(volatile int* flag) {
    while (*flag == 0) { }  // the flag is zero and nobody sets it: this never returns
}

torch::Tensor spin_then_relu(torch::Tensor x) {
    auto flag = torch::zeros({1}, x.options().dtype(torch::kInt));
    spin_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(flag.data_ptr<int>());
    return torch::relu(x);
}
"""

spin_ext = load_inline(name="kbverify_gpu_lifetime_spin", cpp_sources="torch::Tensor spin_then_relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["spin_then_relu"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return spin_ext.spin_then_relu(x)
'''

A_A = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def _smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True).stdout


def _holders(uuid_: str) -> set[int]:
    text = _smi("--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader")
    return {int(line.split(",")[0]) for line in text.splitlines()
            if line.strip() and line.split(",")[1].strip() == uuid_}


def _utilization(uuid_: str) -> int:
    return int(_smi("--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", uuid_).strip())


def _alive_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(name))
    return found


def _a_a():
    verdict = check(load_task(TASK), make_submission(A_A, id="a_a"), VERIFIED.with_overrides(timing_budget_s=2.0),
                    CheckOptions(device=DEVICE, timeout_s=600.0))
    assert verdict.status.value == "passed", verdict.message[:300]
    return verdict


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
def test_a_killed_check_leaves_no_process_on_the_gpu_and_the_next_a_a_is_unchanged(tmp_path):
    device_uuid = gpu_processes._device_uuid(DEVICE)
    before = _a_a()
    submission = tmp_path / "spins.py"
    submission.write_text(SPINS)
    marker = f"KBV_GPU_LIFETIME_{uuid.uuid4().hex}"
    cli = subprocess.Popen([sys.executable, "-m", "kbverify", "check", str(submission), "--task", str(TASK),
                            "--device", DEVICE, "--protocol", "verified", "--timeout", "900"],
                           env={**os.environ, marker: "1"}, cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    ours: set[int] = set()
    try:
        # Spinning: the GPU busy for 3 s in a row while the check runs (the first build takes a while). Where
        # nvidia-smi lists processes by numbers of another PID namespace (a container), ours are not among them:
        # then only the utilization and the processes' own end can tell, and the record says so.
        deadline, busy = time.monotonic() + 600, 0
        while time.monotonic() < deadline and busy < 3 and cli.poll() is None:
            busy = busy + 1 if _utilization(device_uuid) >= 90 else 0
            time.sleep(1.0)
        assert busy >= 3, f"the check never reached its spinning kernel (exit {cli.poll()})"
        ours = gpu_processes.descendants(cli.pid)
        listed = _holders(device_uuid) & ours
        killed_at = time.monotonic()
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()

        def left() -> tuple:
            return _holders(device_uuid) & ours, _alive_with(marker), _utilization(device_uuid)

        while time.monotonic() - killed_at < GONE_WITHIN_S and _still_there(*left()):
            time.sleep(0.1)
        gone_s = time.monotonic() - killed_at
        on_gpu, alive, busy_pct = left()
        assert not _still_there(on_gpu, alive, busy_pct), \
            f"after {gone_s:.1f} s: on the GPU {on_gpu}, alive {alive}, utilization {busy_pct}%"
    finally:
        for pid in _alive_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    after = _a_a()
    looks = after.timing["gpu_processes"]
    assert all(look["checked"] and not look["foreign"] for look in looks), looks
    drift = abs(math.log(after.speedup / before.speedup))
    _record({"gone_s": gone_s, "ours_listed_by_nvidia_smi_while_spinning": sorted(listed), "a_a_before": before.speedup, "a_a_before_ci": before.speedup_ci,
             "a_a_after": after.speedup, "a_a_after_ci": after.speedup_ci, "drift": drift,
             "speed_class": [before.speed_class, after.speed_class], "gpu_processes_after": looks})
    # the A/A is no faster or slower after than before (a kernel left spinning would slow one side's rounds)
    assert {before.speed_class, after.speed_class} <= {"same", "ambiguous"}, (before.speed_class, after.speed_class)
    assert drift < 0.05, (before.speedup, after.speedup)


def _still_there(on_gpu: set, alive: list, utilization: int) -> bool:
    return bool(on_gpu or alive) or utilization >= 50


def _record(row: dict) -> None:
    print(json.dumps({"test": "gpu_lifetime", **row}, default=str))
    path = os.environ.get("KBVERIFY_GPU_RESULTS")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"test": "gpu_lifetime", **row}, default=str) + "\n")
