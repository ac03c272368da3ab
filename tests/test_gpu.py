"""The GPU corpus on a CUDA device: every real CUDA/Triton submission gets the verdict its header promises.

Honest kernels (CUDA extensions that really build, a Triton kernel, a TF32 matmul) must pass `verified`, and their
extensions must be recorded as built and called. Exploits must pass `original` (KernelBench's protocol cannot see
them) and be caught by `verified`. The fairness tests hold the verified accuracy rule to the baseline it times
against: the reference itself with TF32 on passes, a bf16 matmul and zeros on a tiny-magnitude output do not.

With `KBVERIFY_GPU_RESULTS=path.jsonl` every verdict is appended there as one JSON line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corpus_cases import REPO, Case, read_case
from kbverify.core.protocols import ORIGINAL, VERIFIED
from kbverify.core.records import Verdict
from kbverify.core.status import Status, Warn
from kbverify.core.submissions import Submission, load_submission, make_submission
from kbverify.core.tasks import load_task
from kbverify.harness.runner import CheckOptions, check
from kbverify.judge.correctness import grid_key
from kbverify.judge.static import scan
from kbverify.judge.timing import driven_rounds
from kbverify.rescore.importers import Entry
from kbverify.rescore.rescore import prebuild

pytestmark = pytest.mark.gpu

GPU_CORPUS = REPO / "tests" / "gpu_corpus"
GPU_TASKS = REPO / "tasks" / "gpu"
PROTOCOLS = {"original": ORIGINAL, "verified": VERIFIED.with_overrides(timing_budget_s=1.0)}
OPTIONS = CheckOptions(device="cuda:0", timeout_s=900.0)


def gpu_cases(folder: str) -> list[Case]:
    return [read_case(path) for path in sorted((GPU_CORPUS / folder).glob("*.py"))]


HONEST = gpu_cases("honest")
EXPLOITS = gpu_cases("exploits")
# PyTorch-level cheats of the CPU corpus whose effect is on timing, and honest kernels beside them: on a GPU the
# timer, the stream and the baseline's flags are the real ones, so these must hold there as well.
TIMING_CASES_FROM_CPU_CORPUS = [read_case(REPO / "tests" / "corpus" / path) for path in (
    "exploits/gelu_call_counting.py", "exploits/baseline_cudnn_disabled.py", "exploits/baseline_tf32_disabled.py",
    "exploits/tamper_timers.py", "exploits/gemm_relu_bias_id_cache.py", "exploits/matmul_predictable_timed_inputs.py",
    "honest/gelu_erf.py", "honest/conv2d_unfold_gemm.py", "honest/batchnorm_two_pass.py",
    "honest/relu_library_adds_audit_hook.py", "honest/conv_relu_bias_prescaled_in_place_load_pre_hook.py",
    "honest/conv_transpose_fused_clamp_at_the_boundary.py")]


def _record(kind: str, case_id: str, protocol: str, verdict: Verdict, expected: str | None = None) -> None:
    path = os.environ.get("KBVERIFY_GPU_RESULTS")
    if not path:
        return
    build = verdict.build
    row = {"kind": kind, "case": case_id, "task": verdict.task, "protocol": protocol, "status": verdict.status.value,
           "expected": expected, "message": verdict.message[:400], "warnings": list(verdict.warnings),
           "speedup": verdict.speedup, "speedup_ci": list(verdict.speedup_ci) if verdict.speedup_ci else None,
           "speed_class": verdict.speed_class, "ref_time_ms": verdict.ref_time_ms,
           "cand_time_ms": verdict.cand_time_ms, "elapsed_s": verdict.elapsed_s,
           "extension_built": build.extension_built if build else None,
           "extension_called": build.extension_called if build else None,
           "build_error": (build.error[-400:] if build and build.error else None),
           "sets": len(verdict.sets), "failing_set": verdict.reproducer.get("set"),
           "timing": _timing_summary(verdict.timing)}
    with open(path, "a") as handle:
        handle.write(json.dumps(row) + "\n")


def _timing_summary(timing: dict | None) -> dict | None:
    """What a timing verdict was made of, without the raw rounds: the mode and why, both clocks (each with what
    its interval was widened by), and the worker's per-phase host time, so a number that disagrees can be
    traced from the results file alone."""
    if not timing or "mode" not in timing:
        return None
    interleaved = timing.get("interleaved") or {}
    keep = ("mode", "mode_reason", "blocked", "mode_evidence", "clock_used", "device_time_confirmed",
            "unexplained_ms", "clocks", "noise_margin")
    return {**{key: timing.get(key) for key in keep},
            **{key: interleaved.get(key) for key in ("phase_ms_per_call", "cover_ms", "uncovered_calls",
                                                      "host_ms", "hold_probe")},
            "rounds": len(driven_rounds(timing)),
            "clean_rounds": len((timing.get("clean_reference") or {}).get("rounds") or [])}


def _entry(entry_id: str, task_path: Path, submission: Submission) -> Entry:
    return Entry(entry_id=entry_id, task=load_task(task_path), submission=submission, level=None, problem_id=None,
                 sample=0, claimed_speedup=None, unverifiable=None, reference_origin="tasks_dir",
                 modified_reference=None)


@pytest.fixture(scope="module")
def builds() -> dict:
    """Every native submission built once, in parallel, before any verdict is timed (builds are cached by hash)."""
    entries = [_entry(case.id, case.task, load_submission(case.path)) for case in HONEST + EXPLOITS]
    return prebuild(entries, OPTIONS, workers=min(len(entries), os.cpu_count() or 1))


@pytest.mark.parametrize("case", HONEST + EXPLOITS, ids=lambda c: c.id)
def test_gpu_corpus_verdicts(case: Case, builds: dict) -> None:
    _check_case(case, builds)


@pytest.mark.parametrize("case", TIMING_CASES_FROM_CPU_CORPUS, ids=lambda c: c.id)
def test_cpu_corpus_timing_cases_on_gpu(case: Case) -> None:
    _check_case(case, {})


def _check_case(case: Case, builds: dict) -> None:
    task, submission = load_task(case.task), load_submission(case.path)
    native = scan(submission.source).native_sources
    if native:
        built = builds.get(submission.sha256, {})
        assert built.get("ok"), f"module level failed to run: {built.get('error', '')[-2000:]}"
    for name, protocol in PROTOCOLS.items():
        verdict = check(task, submission, protocol, OPTIONS)
        _record(f"{case.path.parent.parent.name}/{case.path.parent.name}", case.id, name, verdict,
                case.expect.get(name))
        allowed = case.expect[name].split("|")
        assert verdict.status.value in allowed, f"{name}: {verdict.status.value} ({verdict.message[:600]})"
        for warning in case.warn.get(name, "").split(","):
            if warning:
                assert warning in verdict.warnings, f"{name}: missing warning {warning}: {verdict.warnings}"
        if native and case.path.parent.name == "honest":
            assert verdict.build is not None and verdict.build.extension_built is True, \
                f"{name}: extension not built: {verdict.build and verdict.build.error[-1500:]}"
            assert verdict.build.extension_called is True, f"{name}: the extension never ran"
        if verdict.correct and protocol.isolated:
            assert verdict.speedup is not None and verdict.speedup_ci is not None
            assert verdict.speedup_ci[0] <= verdict.speedup <= verdict.speedup_ci[1]


# ---- fairness: never demand more accuracy than the baseline timed against ----------------------------------

REFERENCE_WITH_TF32 = '''
import torch


class ModelNew(Model):
    """The task's own Model, run with TF32 on for matmul and cuDNN (what the verified baseline runs)."""

    def forward(self, *args):
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        try:
            return super().forward(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.backends.cudnn.allow_tf32 = cudnn
'''

MATMUL_BF16 = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A.to(torch.bfloat16), B.to(torch.bfloat16)).to(A.dtype)
'''

ZEROS = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
'''

RANDN_MATMUL = GPU_TASKS / "level1" / "3_Matmul_2048x4096x2048_randn.py"
RANDN_CONV = GPU_TASKS / "level1" / "9_Conv2d_64to128_randn.py"
TINY_SOFTMAX = GPU_TASKS / "level1" / "6_Softmax_16x16384_rand.py"


def _verified(task_path: Path, source: str, case_id: str) -> Verdict:
    verdict = check(load_task(task_path), make_submission(source, id=case_id), PROTOCOLS["verified"], OPTIONS)
    _record("fairness", case_id, "verified", verdict)
    return verdict


@pytest.mark.parametrize("task_path", [RANDN_MATMUL, RANDN_CONV], ids=lambda p: p.stem)
def test_reference_with_tf32_passes_verified(task_path: Path) -> None:
    verdict = _verified(task_path, REFERENCE_WITH_TF32, f"tf32_reference/{task_path.stem}")
    assert verdict.status is Status.PASSED, verdict.message[:600]
    # On signed inputs TF32 alone exceeds an element-wise 1e-3 check (measured: up to 18% of elements), so the
    # pass must have come from the baseline allowance, not from a loose tolerance.
    assert Warn.BASELINE_ALLOWANCE_USED.value in verdict.warnings, verdict.warnings


def test_bf16_matmul_fails_verified() -> None:
    verdict = _verified(RANDN_MATMUL, MATMUL_BF16, "bf16/matmul_randn")
    assert verdict.status is Status.INCORRECT, f"{verdict.status.value}: {verdict.message[:300]}"


def test_zeros_on_tiny_output_fail_by_the_norm_rule() -> None:
    verdict = _verified(TINY_SOFTMAX, ZEROS, "zeros/softmax_tiny")
    assert verdict.status is Status.INCORRECT, f"{verdict.status.value}: {verdict.message[:300]}"
    key = grid_key(PROTOCOLS["verified"].atol)
    norm_only = []
    for result in verdict.sets:
        for part in (result.errors.get("comparison") or {}).get("outputs", []):
            if "grid" in part and part["grid"][key]["max_ratio"] <= 1.0 and part["norm_rel"] > 0.5:
                norm_only.append(result.set_id)
    # Element-wise every zero is within 1e-3 of a ~1e-4 output; only the norm-wise error (1.0) rejects it.
    assert norm_only, "no input set where zeros passed element-wise and failed norm-wise"


_CUDA_BUILD_CLAIMING_A_FULL_DISK = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="kbverify_gpu_claims_full_disk", cpp_sources="torch::Tensor f(torch::Tensor x);",
                  cuda_sources="#error No space left on device\\n", functions=["f"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def test_cuda_builds_a_stale_lock_and_a_claimed_machine_failure(tmp_path):
    """On the GPU's toolchain: a torch build lock left by a killed worker does not hang the next check of a CUDA
    extension, and a CUDA build whose output only claims a full disk stays the submission's compile error once a
    CUDA probe extension has built here."""
    task = load_task(GPU_TASKS / "level1" / "2_ReLU_16x16384.py")
    options = CheckOptions(device="cuda:0", timeout_s=600.0, build_cache=tmp_path / "builds")
    honest = load_submission(GPU_CORPUS / "honest" / "relu_cuda.py")
    assert check(task, honest, ORIGINAL, options).status is Status.PASSED
    stale = next((tmp_path / "builds").glob("*/torch_extensions/kbverify_gpu_honest_relu")) / "lock"
    stale.touch()
    retry = check(task, honest, ORIGINAL, CheckOptions(device="cuda:0", timeout_s=120.0,
                                                       build_cache=tmp_path / "builds"))
    _record("build_lock", "relu_cuda", "original", retry)
    assert retry.status is Status.PASSED and not stale.exists()

    claims = make_submission(_CUDA_BUILD_CLAIMING_A_FULL_DISK, id="cuda_claims_full_disk")
    verdict = check(task, claims, ORIGINAL, options)
    _record("machine_failure_claim", "cuda_claims_full_disk", "original", verdict)
    assert verdict.status is Status.COMPILE_ERROR and verdict.build.error_class == "toolchain_unconfirmed"


# ---- forwards that block, both clocks, hangs (issue 20) -------------------------------------------------------

SCALE_SHIFT_TASK = GPU_TASKS / "level1" / "12_ScaleShiftReLU_4096x4096.py"
NORMALIZE_TASK = GPU_TASKS / "level1" / "13_NormalizeByMax_item.py"
# a forward that synchronises inside its call → its honest non-blocking twin
BLOCKING_TWINS = {"scale_shift_relu_cuda_device_sync": "scale_shift_relu_cuda",
                  "scale_shift_relu_item_check": "scale_shift_relu_torch_ops",
                  "scale_shift_relu_host_copy": "scale_shift_relu_torch_ops"}
KERNELBENCH_RUNS = 2  # KernelBench's own measurement, run this often for its run-to-run spread (GPU time is scarce)
SPREAD_PAD = 1.05  # beyond the observed spread of those runs: a 100-trial mean moves this much between processes


def _kernelbench_speedups(task, submission, case_id: str = "") -> list[float]:
    """KernelBench's host-inclusive measurement (`original`: events around each call, synchronised after it, the
    baseline in a process of its own), a few runs for its spread. Each run's own verdict is recorded: its
    reference and candidate times, not only their ratio, say which side a disagreement is on."""
    speedups = []
    for _ in range(KERNELBENCH_RUNS):
        verdict = check(task, submission, ORIGINAL, OPTIONS)
        if case_id:
            _record("kernelbench_run", case_id, "original", verdict)
        assert verdict.status is Status.PASSED, verdict.message[:300]
        speedups.append(verdict.speedup)
    return speedups


def _agrees(interval, speedups: list[float]) -> bool:
    low, high = min(speedups) / SPREAD_PAD, max(speedups) * SPREAD_PAD
    return interval[0] <= high and low <= interval[1]


@pytest.mark.parametrize("blocking", sorted(BLOCKING_TWINS))
def test_blocking_forwards_are_timed_the_way_they_run(blocking: str, builds: dict) -> None:
    """A forward that synchronises inside (cudaDeviceSynchronize in the extension, `.item()`, `.cpu()`) is found
    blocked and timed in sync mode: its verified speedup agrees with KernelBench's host-inclusive one within the
    combined spreads. Its non-blocking twin stays behind the hold, and its host clock agrees the same way. No
    verdict reports a device time above its own host-inclusive time."""
    for name, mode in ((blocking, "sync"), (BLOCKING_TWINS[blocking], "hold")):
        case = read_case(GPU_CORPUS / "honest" / f"{name}.py")
        task, submission = load_task(case.task), load_submission(case.path)
        verdict = check(task, submission, PROTOCOLS["verified"], OPTIONS)
        _record("blocking", case.id, "verified", verdict, "passed")
        assert verdict.status is Status.PASSED, verdict.message[:600]
        timing = verdict.timing
        assert timing["mode"] == mode, (timing["mode"], timing["mode_reason"], timing.get("mode_evidence"))
        clocks = timing["clocks"]
        assert clocks["device"]["cand_ms"] <= clocks["host"]["cand_ms"] * (1 + 1e-9)
        assert clocks["device"]["raw"]["ref_ms"] <= clocks["host"]["raw"]["ref_ms"] * (1 + 1e-9)
        if mode == "sync":
            # the host clock, from the parent's clock less the harness where the worker's was not confirmed
            assert timing["clock_used"] in ("host", "net_wall") and verdict.speedup == clocks["host"]["speedup"]
        kernelbench = _kernelbench_speedups(task, submission, case.id)
        _record("blocking_kernelbench", case.id, "original", verdict, str(kernelbench))
        assert _agrees(clocks["host"]["ci"], kernelbench), (clocks["host"], kernelbench)


def test_the_a_a_of_a_blocking_reference_is_within_one_percent() -> None:
    """The reference itself synchronises (`.item()`), so both sides are timed in sync mode; against itself it
    must read 1x within ±1%."""
    source = "class ModelNew(Model):\n    pass\n"
    verdict = _verified(NORMALIZE_TASK, source, "aa/normalize_by_max_item")
    assert verdict.status is Status.PASSED, verdict.message[:600]
    assert verdict.timing["mode"] == "sync", (verdict.timing["mode_reason"], verdict.timing.get("mode_evidence"))
    assert any(name.startswith(("ref:", "clean_ref:")) for name in verdict.timing["blocked"])
    assert 0.99 <= verdict.speedup <= 1.01, (verdict.speedup, verdict.speedup_ci)
    # and its interval within 2%: first the paired host-kind rounds alone (the measurement's own precision), then
    # the headline, which adds what a rerun redraws (instance differences through Student's t)
    host = verdict.timing["clocks"]["host"]
    paired = host["instances"]["before_ci"]
    assert 0.98 <= paired[0] and paired[1] <= 1.02, (paired, host["raw"], host["n_rounds"])
    assert 0.98 <= verdict.speedup_ci[0] and verdict.speedup_ci[1] <= 1.02, (verdict.speedup_ci, host["instances"])


def test_a_cuda_kernel_that_never_exits_is_a_timeout_within_a_minute_and_the_gpu_stays_usable(builds) -> None:
    case = read_case(GPU_CORPUS / "faults" / "cuda_spin_forever.py")
    task = load_task(case.task)
    verdict = check(task, load_submission(case.path), PROTOCOLS["verified"], OPTIONS)
    _record("hang", case.id, "verified", verdict, "timeout")
    assert verdict.status is Status.TIMEOUT, verdict.message[:600]
    import re

    quiet = re.search(r"no progress for (\d+) s", verdict.message)
    assert quiet and int(quiet[1]) <= 60, verdict.message  # from its forward starting (its last phase) to the kill
    honest = load_submission(GPU_CORPUS / "honest" / "relu_cuda.py")
    after = check(task, honest, PROTOCOLS["verified"], OPTIONS)
    _record("after_hang", "honest/relu_cuda", "verified", after, "passed")
    assert after.status is Status.PASSED, after.message[:600]
