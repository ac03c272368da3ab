"""The audit's child side: run one task's reference over many input sets and return raw numbers.

Everything a threshold applies to is measured here and returned unjudged; `kbverify.audit.judge` decides the flags.
One child per task keeps a broken or huge task from taking the audit down, and keeps the work in one place:
the reference runs over seeds × distributions × weight regimes (× hidden shapes), each output is reduced to
statistics right away, and only two earlier outputs are kept alive (the anchor of its family and the previous
seed's), so memory stays a few outputs whatever the number of sets.

Null kernels (zeros, ones, the input itself, another seed's output or its mean, the reference in bf16 or fp16)
are compared with `correctness.summarize`. To stay cheap, a null kernel is dropped as soon as every protocol
that could still accept it has rejected it on some set — usually on the very first set — and it is tracked only
under the protocols the parent judges it by (the every-distribution variants only for the input itself). Before
the full float64 comparison, `correctness.screen` measures a sample of elements exactly; when that alone proves
every live protocol rejects the kernel (`correctness.certainly_rejects`), the kernel is retired with the sample
as its evidence. The worker only uses `judge_set` to decide what to compute next; the parent re-judges every
recorded summary.

Outputs of 10⁹ elements are reduced in chunks (`kbverify.worker.audit_tensors`), never copied whole to float64. The
null kernels are in `audit_nulls`, the dead-input check in `audit_dead`, what they share in `audit_family`.
"""

from __future__ import annotations

import copy
import os
import re
import statistics
import time
from dataclasses import dataclass

import torch

from kbverify.audit.protocols import read_by_mostly
from kbverify.core.protocols import protocol_from_dict
from kbverify.worker.audit_dead import _dead_check
from kbverify.worker.audit_family import (_copy_tf32, _FamilyContext, _OutOfMemory, _set_id, _stop_if_out_of_memory,
                                         _tf32_summary)
from kbverify.worker.audit_nulls import _NullKernels
from kbverify.worker.audit_tensors import _FRACTION_STATS, _diff_norms, _max_abs_diff, _nan_max, _tensor_stats
from kbverify.worker.evaluate import build_reference, set_inputs, shape_namespaces
from kbverify.worker.precision import set_tf32
from kbverify.worker.worker import announce, device_from, is_cuda_fatal, short_error, task_from


def audit_job(payload: dict) -> dict:
    """The raw audit of one task; out of memory anywhere ends it as an infrastructure error (run it again with the
    device to itself), never as evidence such as an invalid set or a null kernel that could not run. So does a
    CUDA error on a GPU shared through MPS (`shared_gpu`): there any client's fault reaches every client, with
    nothing saying whose it was, so the task is audited again without MPS."""
    try:
        record = _audit(payload)
    except _OutOfMemory as error:
        return {"infrastructure_error": f"out of memory, not evidence about the task: {error}"}
    fatal = _shared_gpu_faults(record) if shared_gpu() else []
    if fatal:
        return {"infrastructure_error": "a CUDA error on a GPU shared through MPS, possibly another client's "
                                        f"fault, not evidence about the task: {fatal[0][:300]}"}
    return record


def shared_gpu() -> bool:
    """Whether this process's CUDA work goes through an MPS daemon named in its environment (kbverify.harness.mps)."""
    return bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))


def _shared_gpu_faults(record: dict) -> list[str]:
    """The record's errors that a fault of another MPS client could explain: any CUDA, cuBLAS or cuDNN error (after
    a fault the others see it in many wordings, "unknown error" and EXECUTION_FAILED among them), or the MPS
    server refusing or dropping us. A task's own such error recurs when it is audited again without MPS."""
    texts = [entry.get("error", "") for entry in record.get("errors", [])]
    texts += [entry.get("invalid_reason", "") for entry in record.get("sets", [])]
    return [text for text in texts if text and (is_cuda_fatal(text) or _SHARED_FAULT.search(text.lower()))]


_SHARED_FAULT = re.compile(r"\bmps\b|cudaerror|cuda error|cublas_status|cudnn_status|cuda_error_")


def _audit(payload: dict) -> dict:
    device = device_from(payload)
    task = task_from(payload)
    settings = payload["settings"]
    protocols = [protocol_from_dict(p) for p in payload["protocols"]]
    set_tf32(matmul=False, cudnn=False)  # the exact-fp32 reference every protocol is judged against
    record: dict = {"device": str(device), "torch": torch.__version__, "sets": [], "families": [],
                    "stochastic": [], "tf32": {}, "errors": [], "phase_s": {}}
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
    started = time.monotonic()
    shapes = _shapes(task, settings, record, payload.get("committed_shapes"))
    _end_phase(record, "hidden_shapes", started, device)
    nulls = _NullKernels(settings["null_kernels"], protocols, settings.get("low_precision_seeds", 1 << 30),
                         judged_by=payload.get("null_kernel_protocols"), screened=payload.get("null_screen", True))
    for shape, overrides in shapes:
        announce(f"audit:load:{shape}")
        try:
            namespace = shape_namespaces(task, [{"shape": shape, "overrides": overrides}])[shape]
        except BaseException as error:  # noqa: BLE001 - a task that does not execute is data
            _stop_if_out_of_memory(error)
            record["errors"].append({"phase": f"load:{shape}", "error": short_error(error)})
            continue
        seeds = settings["input_seeds"] if shape == "original" else settings["input_seeds"][:settings["hidden_seeds"]]
        if _run_shape(namespace, shape, seeds, settings, device, nulls, record, payload.get("replay", True)):
            return _finish(record, nulls)
        if shape == "original":
            for name, job in (("dead", _dead_check), ("timing", _timing)):
                phase = time.monotonic()
                announce(f"audit:{name}")
                try:
                    record[name] = job(namespace, settings, device)
                except BaseException as error:  # noqa: BLE001
                    _stop_if_out_of_memory(error)
                    record["errors"].append({"phase": name, "error": short_error(error)})
                    if is_cuda_fatal(error):
                        return _finish(record, nulls)
                _end_phase(record, name, phase, device)
    return _finish(record, nulls)


def _run_shape(namespace, shape, seeds, settings, device, nulls, record, replay: bool) -> bool:
    """Both weight regimes of one shape (`replay`: the re-randomised one copied from the default one where that is
    what running it would give; off only to show it changes nothing). Returns True after a fatal CUDA error."""
    phase = time.monotonic()
    marks = _Marks(len(record["sets"]), len(record["families"]), len(record["errors"]))
    default = _run_family(namespace, shape, "default", seeds, settings, device, nulls, record)
    _end_phase(record, f"sets:{shape}:default", phase, device)
    if default.fatal:
        return True
    phase = time.monotonic()
    if replay and _replayable(marks, default, record):
        _replay_family(marks, record, nulls, device)
        fatal = False
    else:
        fatal = _run_family(namespace, shape, "rerandomized", seeds, settings, device, nulls, record).fatal
    _end_phase(record, f"sets:{shape}:rerandomized", phase, device)
    return fatal


def _finish(record: dict, nulls: "_NullKernels") -> dict:
    record["null_kernels"] = nulls.export()
    device = torch.device(record["device"])
    if device.type == "cuda":
        # what the scheduler's memory factor is checked against (the caching allocator's reserve is the peak the
        # other copies on the GPU actually lose); the phases' peaks were reset as each ended
        phases = record.get("phase_peak_bytes", {}).values()
        record["peak_memory_bytes"] = {
            kind: max([getattr(torch.cuda, f"max_memory_{kind}")(device)] + [p[kind] for p in phases])
            for kind in ("allocated", "reserved")}
    return record


def _end_phase(record: dict, name: str, started: float, device) -> None:
    """The phase's seconds and, on a GPU, its own memory peaks: which phase holds a task's reserve."""
    record["phase_s"][name] = time.monotonic() - started
    if device.type == "cuda":
        record.setdefault("phase_peak_bytes", {})[name] = {"allocated": torch.cuda.max_memory_allocated(device),
                                                           "reserved": torch.cuda.max_memory_reserved(device)}
        torch.cuda.reset_peak_memory_stats(device)


def _shapes(task, settings: dict, record: dict, committed: list[dict] | None) -> list[tuple[str, dict]]:
    shapes = [("original", {})]
    if not settings["hidden_shapes"]:
        record["hidden"] = {"origin": "off", "shapes": []}
        return shapes
    try:
        from kbverify.shapes import hidden
    except ImportError:
        record["hidden"] = {"origin": "unavailable", "shapes": []}
        return shapes
    announce("audit:hidden_shapes")
    try:
        if committed is not None:
            found = [hidden.HiddenShape.from_json(shape) for shape in committed]
            origin = "committed" if found else "none"
        else:
            found, origin = hidden.shapes_for(task, [])
    except BaseException as error:  # noqa: BLE001 - hidden shapes are extra evidence, not a precondition
        _stop_if_out_of_memory(error)
        record["hidden"] = {"origin": "error", "error": short_error(error), "shapes": []}
        return shapes
    labelled = [(shape.label or f"hidden:{index}", dict(shape.overrides)) for index, shape in enumerate(found)]
    record["hidden"] = {"origin": origin, "shapes": [{"label": label, "overrides": overrides}
                                                     for label, overrides in labelled]}
    return shapes + labelled


# ---- the sets of one (shape, weight regime) ----------------------------------------------------------------

@dataclass(frozen=True)
class _FamilyRun:
    fatal: bool  # a fatal CUDA error: nothing more can run in this process
    weightless: bool  # the model has no non-empty floating parameter or buffer: re-randomising changes nothing


@dataclass(frozen=True)
class _Marks:
    """Where a family's entries begin in the record's lists."""

    sets: int
    families: int
    errors: int


def _run_family(namespace, shape, weights, seeds, settings, device, nulls, record) -> _FamilyRun:
    """Every (distribution, seed) set of one shape and weight regime."""
    family = {"shape": shape, "weights": weights, "compared": 0, "max_abs_spread": 0.0, "max_abs": 0.0,
              "anchor": None, "note": ""}
    record["families"].append(family)
    announce(f"audit:construct:{shape}:{weights}")
    try:
        model = build_reference(namespace, settings["weight_seed"], weights, device, True)[0]
    except BaseException as error:  # noqa: BLE001
        _stop_if_out_of_memory(error)
        family["note"] = "construct raised: " + short_error(error)
        return _FamilyRun(fatal=is_cuda_fatal(error), weightless=False)
    # rerandomized_state keeps non-floating and empty entries as they are and redraws every other one
    weightless = not any(v.is_floating_point() and v.numel() for v in model.state_dict().values())
    fatal = _run_sets(namespace, shape, weights, seeds, settings, device, nulls, record, family, model)
    del model
    if not fatal and device.type == "cuda":
        torch.cuda.empty_cache()  # the family's outputs and model gone: give their memory back to the other audits
    return _FamilyRun(fatal=fatal, weightless=weightless)


def _run_sets(namespace, shape, weights, seeds, settings, device, nulls, record, family, model) -> bool:
    """The family's sets, in order. Returns True after a fatal CUDA error."""
    anchor = None
    context = _FamilyContext(namespace, model, device)
    for distribution in settings["distributions"]:
        previous = None
        for index, seed in enumerate(seeds):
            meta = {"set_id": _set_id(shape, distribution, weights, index), "shape": shape,
                    "distribution": distribution, "weights": weights, "seed": seed, "seed_index": index}
            announce(f"audit:set:{meta['set_id']}")
            try:
                output, stats = _reference_set(context, meta, settings, record)
            except BaseException as error:  # noqa: BLE001 - the reference failing makes the set invalid
                _stop_if_out_of_memory(error)
                record["sets"].append({**meta, "valid": False, "invalid_reason": "reference raised: "
                                       + short_error(error)})
                if is_cuda_fatal(error):
                    record["errors"].append({"phase": meta["set_id"], "error": short_error(error), "fatal": True})
                    return True
                continue
            if output is None:
                continue
            if anchor is None:
                anchor, family["anchor"] = output, meta["set_id"]
            else:
                spread = _max_abs_diff(anchor, output)
                family["compared"] += 1
                family["max_abs_spread"] = _nan_max(family["max_abs_spread"], spread)
            family["max_abs"] = max(family["max_abs"], max((s["max_abs"] for s in stats if "max_abs" in s),
                                                           default=0.0))
            try:
                nulls.check(context, meta, output, previous, record)
            except BaseException as error:  # noqa: BLE001 - e.g. out of memory comparing a huge output
                _stop_if_out_of_memory(error)
                record["errors"].append({"phase": f"null:{meta['set_id']}", "error": short_error(error)})
                nulls.abandon(f"{meta['set_id']}: " + short_error(error, 300))
                if is_cuda_fatal(error):
                    return True
            previous = output if nulls.wants_previous() else None  # else it only holds memory
    return False


# ---- a re-randomised family that is the default one -------------------------------------------------------

def _replayable(marks: _Marks, default: _FamilyRun, record: dict) -> bool:
    """Whether the re-randomised family would repeat the default family's computations bit for bit: the model has
    no floating state to redraw (so both models are the same: same class, same arguments, same seed), and the
    reference is deterministic — every stochastic rerun (same set, reseeded) gave identical outputs (‖Δ‖ = 0 and
    max|Δ| = 0). The default family must also have run cleanly (every model built, the reference raising on no
    set — out of memory, say, may not recur —, no error in its checks), so that nothing in it depended on a
    failure that might not recur."""
    reruns = record["stochastic"]
    family = record["families"][marks.families]
    raised = any(s.get("invalid_reason", "").startswith("reference raised") for s in record["sets"][marks.sets:])
    return (default.weightless and not family["note"] and not raised and len(record["errors"]) == marks.errors
            and bool(reruns) and all(r["diff_norm"] == 0.0 and r["max_abs_diff"] == 0.0 for r in reruns))


def _replay_family(marks: _Marks, record: dict, nulls: "_NullKernels", device) -> None:
    """Record the re-randomised family from the default one's entries, as running it would have: each set's
    entry and TF32 baseline under its own set id, the family's spread, and the null kernels' checks through the
    same liveness rules (`_NullKernels.replay`)."""
    source = record["families"][marks.families]
    sets = record["sets"][marks.sets:]
    family = {**source, "weights": "rerandomized", "anchor": None,
              "note": "replayed from the default weights: no floating parameter or buffer, deterministic reference"}
    ids = {}
    for entry in sets:
        ids[entry["set_id"]] = _set_id(entry["shape"], entry["distribution"], "rerandomized", entry["seed_index"])
    if source["anchor"] is not None:
        family["anchor"] = ids[source["anchor"]]
    record["families"].append(family)
    for entry in sets:
        meta = {key: entry[key] for key in ("shape", "distribution", "seed", "seed_index")}
        meta.update(set_id=ids[entry["set_id"]], weights="rerandomized")
        replayed = {**copy.deepcopy(entry), **meta}
        for stats in replayed.get("outputs", []) if not read_by_mostly(replayed) else ():
            for name in _FRACTION_STATS:  # as _reference_set would have left them on this set
                stats.pop(name, None)
        record["sets"].append(replayed)
        if not entry["valid"]:
            continue
        # _reference_set computes this baseline on every valid first-seed set of the task's own shape
        if device.type == "cuda" and meta["shape"] == "original" and meta["seed_index"] == 0:
            _copy_tf32(record, entry["set_id"], meta["set_id"])
        nulls.replay(meta, entry["set_id"], record)


def _reference_set(context: _FamilyContext, meta: dict, settings: dict, record: dict) -> tuple[list | None, list]:
    """Run the reference on one set, record its statistics; the output (None when it is not finite) and them."""
    output = context.call(context.model, context.inputs(meta), meta)
    # The fractions feed one rule, which reads a few sets; on every other set they were two thirds of the
    # statistics' passes over the output, the largest share of the hidden shapes' device work.
    stats = [_tensor_stats(t, fractions=read_by_mostly(meta)) for t in output]
    entry = {**meta, "valid": True, "outputs": stats}
    bad = sum(s.get("nonfinite", 0) for s in stats)
    if bad:
        entry.update(valid=False, invalid_reason=f"reference output has {bad} non-finite values")
        record["sets"].append(entry)
        return None, stats
    record["sets"].append(entry)
    try:  # our own checks from here on: a failure is ours to record, not the set's
        if meta["shape"] == "original" and meta["weights"] == "default" and meta["distribution"] == "x1":
            again = context.call(context.model, context.inputs(meta), meta)
            diff_norm, ref_norm, max_abs = _diff_norms(output, again)
            del again
            record["stochastic"].append({"set_id": meta["set_id"], "diff_norm": diff_norm, "ref_norm": ref_norm,
                                         "max_abs_diff": max_abs})
        if context.device.type == "cuda" and meta["shape"] == "original" and meta["seed_index"] == 0:
            _tf32_summary(context, meta, output, record)
    except BaseException as error:  # noqa: BLE001
        _stop_if_out_of_memory(error)
        record["errors"].append({"phase": f"checks:{meta['set_id']}", "error": short_error(error)})
        if is_cuda_fatal(error):
            raise
    return output, stats


# ---- null kernels ------------------------------------------------------------------------------------------


# ---- dead inputs and parameters ----------------------------------------------------------------------------


# ---- timing (GPU only) -------------------------------------------------------------------------------------

def _timing(namespace, settings: dict, device) -> dict | None:
    """Median time per reference call (CUDA events around the call), next to the time of one tiny kernel."""
    if device.type != "cuda":
        return None
    model = build_reference(namespace, settings["weight_seed"], "default", device, True)[0]
    inputs = set_inputs(namespace, {"seed": settings["input_seeds"][0], "distribution": "x1"}, device)
    tiny = torch.zeros(1, device=device)
    with torch.no_grad():
        reference = _event_samples(lambda: model(*inputs), settings,
                                   decided_us=settings.get("timing_decided_us"))
        floor = _event_samples(lambda: tiny.add_(1.0), settings)
    return {"reference_us": reference, "launch_floor_us": floor,
            "reference_median_us": statistics.median(reference), "launch_floor_median_us": statistics.median(floor)}


def _event_samples(function, settings: dict, *, decided_us: float | None = None) -> list[float]:
    for _ in range(settings["timing_warmup_calls"]):
        function()
    torch.cuda.synchronize()

    def one_call_us() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0

    return samples_until_decided(one_call_us, settings["timing_calls"], decided_us)


def samples_until_decided(one_call_us, planned: int, decided_us: float | None) -> list[float]:
    """Up to `planned` samples; fewer once more than half of the planned ones are >= `decided_us`: the median of
    all `planned` (for an even count, the mean of the two middle ones) is then >= `decided_us` whatever the rest."""
    samples: list[float] = []
    at_or_above = 0
    for _ in range(planned):
        samples.append(one_call_us())
        at_or_above += decided_us is not None and samples[-1] >= decided_us
        if at_or_above > planned // 2:
            break
    return samples


# ---- small numeric helpers ---------------------------------------------------------------------------------


# A float64 copy of a whole output (what `dtype=torch.float64` makes in a norm or a mean) is 12 GB at 1.6·10⁹
# elements, and several audits share a GPU: tensors above CHUNK_ELEMENTS are reduced chunk by chunk. Below it the
# numbers are computed as they always were, bit for bit; above it, sums in another order differ from a one-shot
# float64 reduction by rounding only (measured: 1e-13 relative on 10⁸ elements, against thresholds of 1e-5 and up).


