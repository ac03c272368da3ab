"""The `original` protocol: KernelBench v0.1's `eval_kernel_against_ref`, bug for bug (SPEC §2).

Reproduced on purpose: the submission is exec'd into the reference's namespace (a rebound `batch_size` shrinks the
inputs), both models stay in training mode, the reference runs first on the same input tensors, `allclose(ref,
cand, 1e-2, 1e-2)` (rtol scales with the candidate), 5 trials with seeds derived from 42, the candidate timed with
autograd on over 3 warm-ups and 100 trials on the same inputs, mean rounded to 3 significant figures. What is
added is only observation: which constants the submission rebound and whether its native extension built and ran.
On a CPU the CUDA events become `perf_counter_ns`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from kbverify.worker.extensions import ExtensionWatch
from kbverify.worker.worker import announce, device_from, set_seed, short_error, synchronize, task_from, to_device

SEED = 42
ATOL = RTOL = 1e-2


PROGRESS_EVERY_S = 1.0


class _Heartbeat:
    """`phase` announced again, between calls and at most every PROGRESS_EVERY_S, so the parent's hang budget
    (kbverify.harness.hang) sees a timed candidate make progress; never inside a measured call."""

    def __init__(self, phase: str | None):
        self.phase, self.last = phase, time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        if self.phase is not None and now - self.last >= PROGRESS_EVERY_S:
            announce(self.phase)
            self.last = now


def _timed_calls(fn, args, *, warmups: int, trials: int, device: torch.device,
                 device_warmup_s: float = 0.0, progress: str | None = None) -> list[float]:
    """time_execution_with_cuda_event: synchronise after each call; events on the current stream.

    `device_warmup_s` > 0 (not KernelBench's behaviour) runs the model that long first, so that a GPU that idled
    between processes is at its working clocks when the measured calls start. `progress`: a phase announced again
    between calls (see _Heartbeat)."""
    beat = _Heartbeat(progress)
    deadline = time.monotonic() + device_warmup_s
    while time.monotonic() < deadline:
        fn(*args)
        synchronize(device)
        beat()
    for _ in range(warmups):
        fn(*args)
        synchronize(device)
        beat()
    times_ms = []
    for _ in range(trials):
        beat()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize(device)
            times_ms.append(start.elapsed_time(end))
        else:
            started = time.perf_counter_ns()
            fn(*args)
            times_ms.append((time.perf_counter_ns() - started) / 1e6)
    return times_ms


def timing_stats(times_ms: list[float]) -> dict:
    """get_timing_stats: every statistic rounded to 3 significant figures, as KernelBench stores them."""
    return {
        "mean": float(f"{np.mean(times_ms):.3g}"),
        "std": float(f"{np.std(times_ms):.3g}"),
        "min": float(f"{np.min(times_ms):.3g}"),
        "max": float(f"{np.max(times_ms):.3g}"),
        "num_trials": len(times_ms),
    }


def _load_reference(source: str, context: dict):
    exec(compile(source, "<string>", "exec"), context)
    return context.get("Model"), context.get("get_init_inputs"), context.get("get_inputs")


def _snapshot(context: dict, names) -> dict:
    return {name: context.get(name) for name in names}


def _definitions(source: str) -> dict[str, str]:
    """Top-level function and class definitions of a source, as AST dumps (formatting and comments ignored)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: ast.dump(node) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _rebound(before: dict, context: dict, task_source: str, submission_source: str) -> list[str]:
    """Names whose value the submission changed in the shared namespace. Redefining a function or class with
    the same code (submissions often repeat get_inputs) changes nothing and is not reported."""
    task_defs, submission_defs = _definitions(task_source), _definitions(submission_source)
    changed = []
    for name, value in before.items():
        now = context.get(name)
        if now is value or (name in task_defs and task_defs.get(name) == submission_defs.get(name)):
            continue
        try:
            same = bool(now == value)
        except Exception:  # noqa: BLE001 - tensors and odd objects compare ambiguously
            same = False
        if not same:
            changed.append(name)
    return sorted(changed)


@dataclass(frozen=True)
class _SharedReference:
    """The reference as KernelBench v0.1 builds it, in the namespace the submission will be exec'd into: the
    namespace itself, the watched names' values before the submission ran, the init inputs and the model."""

    context: dict
    before: dict
    init_inputs: list
    get_inputs: object
    model: object

    @classmethod
    def load(cls, task, device) -> "_SharedReference":
        context: dict = {}
        Model, get_init_inputs, get_inputs = _load_reference(task.source, context)
        watched = [name for name in task.constants] + ["Model", "get_inputs", "get_init_inputs"]
        before = _snapshot(context, watched)
        set_seed(SEED)
        init_inputs = to_device(get_init_inputs(), device)
        with torch.no_grad():
            set_seed(SEED)
            original_model = Model(*init_inputs)
        return cls(context, before, init_inputs, get_inputs, original_model)


def eval_job(payload: dict) -> dict:
    device = device_from(payload)
    task = task_from(payload)
    trials = int(payload.get("trials", 5))
    timing_trials = int(payload.get("timing_trials", 100))
    warmups = int(payload.get("warmup_calls", 3))
    record: dict = {"compiled": False, "correctness": False, "trials": [], "namespace_rebind": []}
    if payload.get("baseline_first"):
        record["baseline"] = _baseline_before_candidate(payload, device)

    announce("reference:load")
    reference = _SharedReference.load(task, device)
    context, before, init_inputs = reference.context, reference.before, reference.init_inputs
    get_inputs, original_model = reference.get_inputs, reference.model

    announce("candidate:load")
    watch = ExtensionWatch().install()
    record["extensions"] = watch.record()
    try:
        exec(compile(payload["submission_source"], "<string>", "exec"), context)
        ModelNew = context.get("ModelNew")
        synchronize(device)
    except BaseException as error:  # noqa: BLE001 - KernelBench records any exec failure as a compile failure
        record["compilation_error"] = short_error(error)
        record["extensions"] = watch.record()
        return record
    record["namespace_rebind"] = _rebound(before, context, task.source, payload["submission_source"])
    record["extensions"] = watch.record()
    if ModelNew is None:
        record["compilation_error"] = "SyntaxError: the submission defines no ModelNew"
        return record
    record["compiled"] = True
    try:
        with torch.no_grad():
            set_seed(SEED)
            custom_model = ModelNew(*init_inputs)
            synchronize(device)
    except BaseException as error:  # noqa: BLE001
        record["runtime_error"] = short_error(error)
        record["extensions"] = watch.record()
        return record

    announce("candidate:correctness")
    try:
        correct = _run_and_check(original_model, custom_model, get_inputs, trials, device, record)
    except BaseException as error:  # noqa: BLE001
        record["runtime_error"] = short_error(error)
        correct = False
    record["correctness"] = correct
    record["extensions"] = watch.record()
    if not correct:
        return record

    announce("candidate:timing")
    _time_candidate(custom_model, get_inputs, payload, device, warmups, timing_trials, record)
    record["extensions"] = watch.record()
    return record


def _time_candidate(custom_model, get_inputs, payload: dict, device, warmups: int, timing_trials: int,
                    record: dict) -> None:
    """The candidate timed as KernelBench times it (one input draw from SEED, autograd on unless the payload says
    otherwise); a failure is recorded as KernelBench records it, as an error during performance."""
    try:
        synchronize(device)
        set_seed(SEED)
        inputs = to_device(get_inputs(), device)
        model_new = custom_model.to(device)
        synchronize(device)
        grad = bool(payload.get("candidate_grad_enabled", True))
        with torch.set_grad_enabled(grad):
            times_ms = _timed_calls(model_new, inputs, warmups=warmups, trials=timing_trials, device=device,
                                    device_warmup_s=float(payload.get("device_warmup_s", 0.0)),
                                    progress="candidate:timing")
        record["times_ms"] = times_ms
        record["runtime_stats"] = timing_stats(times_ms)
        record["runtime_ms"] = record["runtime_stats"]["mean"]
        record["input_shapes"] = [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
    except BaseException as error:  # noqa: BLE001
        record["error_during_performance"] = short_error(error)


def _run_and_check(original_model, custom_model, get_inputs, trials: int, device, record: dict) -> bool:
    torch.manual_seed(SEED)
    trial_seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(trials)]
    passes = 0
    with torch.no_grad():
        for number, trial_seed in enumerate(trial_seeds):
            announce(f"candidate:correctness:{number}")  # each trial is progress (kbverify.harness.hang)
            set_seed(trial_seed)
            inputs = to_device(get_inputs(), device)
            set_seed(trial_seed)
            model = original_model.to(device)
            set_seed(trial_seed)
            model_new = custom_model.to(device)
            output = model(*inputs)
            synchronize(device)
            output_new = model_new(*inputs)
            synchronize(device)
            entry = {"seed": int(trial_seed)}
            record["trials"].append(entry)
            if output.shape != output_new.shape:
                entry["shape_mismatch"] = f"expected {tuple(output.shape)}, got {tuple(output_new.shape)}"
                record["correctness_issue"] = "shape_mismatch"
                return False
            if torch.allclose(output, output_new, atol=ATOL, rtol=RTOL):
                passes += 1
                entry["passed"] = True
            else:
                entry["passed"] = False
                entry["max_difference"] = torch.max(torch.abs(output - output_new)).item()
                entry["avg_difference"] = torch.mean(torch.abs(output - output_new)).item()
                record["correctness_issue"] = "output_mismatch"
            entry["input_shapes"] = [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
    record["correctness_trials"] = f"({passes} / {trials})"
    return passes == trials


def _baseline_before_candidate(payload: dict, device: torch.device) -> dict:
    """The baseline in the evaluating process, before any candidate code exists in it: what KernelBench's
    baseline script sees (a fresh process, the reference alone), without a second process and CUDA context.
    The flags it sets are put back before the candidate's evaluation, which KernelBench runs on defaults.
    Candidate code shares this process afterwards, as it shares its own timing in KernelBench: this protocol
    reproduces KernelBench's numbers and is no defence against a submission that forges them."""
    from kbverify.worker.precision import assert_baseline_flags, tf32_state

    flags = tf32_state()
    try:
        return baseline_job(payload, device=device)
    except BaseException as error:  # noqa: BLE001 - the reference failing is reported, not the candidate's fault
        return {"error": short_error(error)}
    finally:
        assert_baseline_flags(flags)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def baseline_job(payload: dict, device: torch.device | None = None) -> dict:
    """measure_program_time from KernelBench's generate_baseline_time.py: the reference alone, no_grad."""
    device = device or device_from(payload)
    task = task_from(payload)
    announce("reference:timing")
    _apply_baseline_flags(payload)
    context: dict = {}
    Model, get_init_inputs, get_inputs = _load_reference(task.source, context)
    with torch.no_grad():
        synchronize(device)
        set_seed(SEED)
        inputs = get_inputs()
        set_seed(SEED)
        init_inputs = get_init_inputs()
        inputs = to_device(inputs, device)
        init_inputs = to_device(init_inputs, device)
        model = Model(*init_inputs).to(device)
        synchronize(device)
        times_ms = _timed_calls(model, inputs, warmups=int(payload.get("warmup_calls", 3)),
                                trials=int(payload.get("timing_trials", 100)), device=device,
                                device_warmup_s=float(payload.get("device_warmup_s", 0.0)))
    return {"times_ms": times_ms, "runtime_stats": timing_stats(times_ms), "runtime_ms": timing_stats(times_ms)["mean"],
            "input_shapes": [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]}


def _apply_baseline_flags(payload: dict) -> None:
    from kbverify.worker.precision import set_tf32

    set_tf32(matmul=bool(payload.get("baseline_matmul_tf32", False)),
             cudnn=bool(payload.get("baseline_cudnn_tf32", True)))


def candidate_timing_job(payload: dict) -> dict:
    """KernelBench's timing of a candidate (warm-ups, trials, mean, same inputs each call), with the submission
    in a namespace of its own: the timing half of protocols that check correctness in isolation."""
    from kbverify.worker.worker import compile_untrusted

    device = device_from(payload)
    task = task_from(payload)
    announce("reference:load")
    context: dict = {}
    _load_reference(task.source, context)
    namespace = {k: v for k, v in context.items() if not k.startswith("__")}
    namespace["__name__"] = "kbverify_submission"
    announce("candidate:timing")
    try:
        exec(compile_untrusted(payload["submission_source"]), namespace)
        set_seed(SEED)
        init_inputs = to_device(context["get_init_inputs"](), device)
        set_seed(SEED)
        model = namespace["ModelNew"](*init_inputs).to(device)
        set_seed(SEED)
        inputs = to_device(context["get_inputs"](), device)
        with torch.set_grad_enabled(bool(payload.get("candidate_grad_enabled", False))):
            times_ms = _timed_calls(model, inputs, warmups=int(payload.get("warmup_calls", 3)),
                                    trials=int(payload.get("timing_trials", 10)), device=device,
                                    device_warmup_s=float(payload.get("device_warmup_s", 0.0)))
    except BaseException as error:  # noqa: BLE001
        return {"error": short_error(error)}
    return {"times_ms": times_ms, "runtime_stats": timing_stats(times_ms), "runtime_ms": timing_stats(times_ms)["mean"]}
