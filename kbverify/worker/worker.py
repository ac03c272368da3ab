"""Child-side plumbing shared by every job (the channel, phases, devices, seeds, loading code), and the job table.

Everything here runs inside a sandboxed child (kbverify.harness.sandbox); the parent never imports a submission.
"""

from __future__ import annotations

import json
import os
import time
import traceback

import torch

from kbverify.core import tasks as tasks_module
from kbverify.harness import channel

# The job's ends of its channel (kbverify.harness.channel): messages up to the supervisor, commands down from it. Pipes,
# not files: no other process can name them.
_CHANNEL: dict = {"up": None, "down": None}
_LAST_PHASE = [""]  # a list: its contents change during the job, the tamper snapshot keeps its identity
_JOB_STARTED = 0.0
# Seconds this child's job spent in each kind of phase, in order of first appearance: announce() closes the
# running phase and opens the next (a kind is the phase's first two parts, without an input set: "candidate:run:<set>"
# and "judge:<set>" → "candidate:run" and "judge:original").
_PHASE_SECONDS: dict[str, float] = {}
_PHASE_SINCE = [0.0]  # when the last announced phase (or the job, before any) began
_PHASE_KIND = [""]  # the running phase's kind, for the accounts above


def attach_channel(up_fd: int, down_fd: int) -> None:
    _CHANNEL["up"], _CHANNEL["down"] = up_fd, down_fd


def send(message: dict) -> None:
    """A message to the parent (through the supervisor); dropped where the job runs without a channel."""
    if _CHANNEL["up"] is not None:
        channel.write_message(_CHANNEL["up"], message)


def receive_command() -> dict | None:
    """The parent's next command, or None once the parent has closed the channel."""
    if _CHANNEL["down"] is None:
        return None
    body = channel.read_frame(_CHANNEL["down"])
    if body is None:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def run_job(job: str, payload: dict) -> dict:
    global _JOB_STARTED
    _LAST_PHASE[0] = ""
    _PHASE_KIND[0] = ""
    _JOB_STARTED = time.monotonic()
    _PHASE_SECONDS.clear()
    _PHASE_SINCE[0] = _JOB_STARTED
    torch.set_num_threads(1)
    if str(payload.get("device", "cpu")).startswith("cuda") and job != "probe":
        # Bring CUDA up before any untrusted code runs, so a broken device is our failure, never the kernel's.
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    import importlib

    module_name, _, function = JOBS[job].partition(":")
    if module_name == __name__:
        result = globals()[function](payload)
    else:
        result = getattr(importlib.import_module(module_name), function)(payload)
    if isinstance(result, dict):
        result.update(_time_accounts())
    if isinstance(result, dict) and job != "probe":
        from kbverify.worker import guards

        if guards.refused:
            result["refused"] = sorted(set(guards.refused))
        if guards.quietly_refused:
            result["quietly_refused"] = sorted(set(guards.quietly_refused))
    return result


JOBS = {
    "kernelbench_eval": "kbverify.worker.kernelbench_v01:eval_job",
    "kernelbench_baseline": "kbverify.worker.kernelbench_v01:baseline_job",
    "kernelbench_candidate_timing": "kbverify.worker.kernelbench_v01:candidate_timing_job",
    "candidate": "kbverify.worker.evaluate:candidate_job",
    "judge": "kbverify.worker.evaluate:judge_job",
    "timing": "kbverify.worker.timing:timing_job",
    "reference_timing": "kbverify.worker.timing:reference_timing_job",
    "timing_check": "kbverify.worker.timing_check:timing_check_job",
    "build": "kbverify.worker.extensions:build_job",
    "audit": "kbverify.worker.audit_worker:audit_job",
    "footprint": "kbverify.worker.footprint_worker:footprint_job",
    "probe": "kbverify.worker.worker:probe_job",
    "hidden": "kbverify.worker.worker:hidden_job",
}


def announce(phase: str) -> None:
    """Record what the child is doing, so a crash is attributed to the right party."""
    now = time.monotonic()
    _close_phase(now)
    # Only the party stays in this process (the submission can read it); the phase itself goes to the parent.
    _LAST_PHASE[0] = phase.split(":")[0]
    _PHASE_KIND[0] = phase_kind(phase)
    _PHASE_NOW[0] = phase
    send({"kind": channel.PHASE, "phase": phase})


_PHASE_NOW = [""]  # the whole phase, to announce again after a build inside it


def last_phase() -> str:
    return _LAST_PHASE[0]


def phase_kind(phase: str) -> str:
    return ":".join(phase.split(":")[:2]).split("/")[0] if phase else "worker:start"


def _time_accounts() -> dict:
    """Where this worker's time went, by kind of phase. Taken defensively: the submission runs in this process and
    can reach these globals, and a failure here must not turn its verdict into our infrastructure error."""
    try:
        _close_phase(time.monotonic())
        phases = [[kind, round(seconds, 4)] for kind, seconds in _PHASE_SECONDS.items()
                  if type(kind) is str and type(seconds) is float]
        return {"_phases_s": phases, "_job_s": round(float(time.monotonic() - _JOB_STARTED), 4)}
    except Exception:  # noqa: BLE001 - tampered bookkeeping: no accounts, the verdict stands
        return {}


def _close_phase(now: float) -> None:
    kind = _PHASE_KIND[0] or phase_kind("")
    _PHASE_SECONDS[kind] = _PHASE_SECONDS.get(kind, 0.0) + (now - _PHASE_SINCE[0])
    _PHASE_SINCE[0] = now


def device_from(payload: dict) -> torch.device:
    if payload.get("device", "cpu").startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA requested but not available in the worker")
        return torch.device("cuda", 0)
    return torch.device("cpu")


# Taken when the worker module loads (in the forkserver, before any submission): a submission that rebinds
# torch.manual_seed, torch.default_generator or torch.cuda.manual_seed_all cannot steer the harness's seeds.
_CPU_GENERATOR = torch.default_generator
_CUDA_SEED_ALL = torch.cuda.manual_seed_all
_CUDA_AVAILABLE = torch.cuda.is_available


def set_seed(seed: int) -> None:
    """torch.manual_seed's effect (CPU and every CUDA generator) through generators captured before any
    submission ran, and without torch.manual_seed's per-call wrapper overhead."""
    _CPU_GENERATOR.manual_seed(seed)
    if _CUDA_AVAILABLE():
        _CUDA_SEED_ALL(seed)  # queued by torch until CUDA starts, as torch.manual_seed does


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(values, device: torch.device) -> list:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def task_from(payload: dict) -> tasks_module.Task:
    return tasks_module.parse_task(payload["task_source"], name=payload["task_name"])


def compile_untrusted(source: str, filename: str = "<submission>"):
    """Compile a submission under a unique file name registered with linecache: Triton's @jit reads the kernel's
    source through inspect, which needs it."""
    import hashlib
    import linecache

    name = f"{filename[:-1]}-{hashlib.sha256(source.encode()).hexdigest()[:12]}>" if filename.endswith(">") else filename
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    return compile(source, name, "exec")


def short_error(error: BaseException, limit: int = 2000) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_traceback(error: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text[-limit:]


def is_cuda_fatal(error: BaseException | str) -> bool:
    """After these the CUDA context is unusable: the child must stop."""
    text = str(error).lower()
    return any(marker in text for marker in (
        "illegal memory access", "misaligned address", "unspecified launch failure", "device-side assert",
        "illegal instruction", "an illegal", "cuda error: launch failure", "uncorrectable ecc",
    ))


def probe_job(payload: dict) -> dict:
    """What this worker sees: versions and devices (for provenance and `--device auto`)."""
    available = torch.cuda.is_available()
    cuda_error = None
    if not available and torch.version.cuda:
        try:
            torch.cuda.init()
        except Exception as error:  # noqa: BLE001 - the reason is what the caller needs to see
            cuda_error = short_error(error, 500)
    wants_cuda = payload.get("device", "cpu").startswith("cuda")
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "cuda_available": available,
        "cuda_error": cuda_error,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_count": torch.cuda.device_count() if available else 0,
        "gpu_name": torch.cuda.get_device_name(0) if available and wants_cuda else None,
    }


def _cudnn_version():
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:
        return None


def hidden_job(payload: dict) -> dict:
    """Generate a task's hidden shapes here, not in the parent: generating executes the (untrusted) reference."""
    from kbverify.shapes import hidden

    announce("reference:hidden-shapes")
    shapes = hidden.generate_hidden_shapes(task_from(payload))
    return {"shapes": [shape.to_json() for shape in shapes]}
