"""The audit's child side: run one task's reference over many input sets and return raw numbers.

Everything a threshold applies to is measured here and returned unjudged; `kbverify.audit` decides the flags.
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

Outputs of 10⁹ elements are reduced in chunks (`CHUNK_ELEMENTS`), never copied whole to float64.
"""

from __future__ import annotations

import copy
import math
import os
import re
import statistics
import time
from dataclasses import dataclass

import torch

from kbverify.audit.protocols import covers, protocol_from_dict, read_by_mostly
from kbverify.audit.records import NEAR_ATOLS
from kbverify.correctness import (CHUNK_ELEMENTS, certainly_rejects, flatten_outputs, judge_set, screen,
                                  summarize)
from kbverify.child.evaluate import build_reference, set_inputs, shape_namespaces
from kbverify.inputs import derive_seed
from kbverify.child.precision import set_tf32
from kbverify.child.worker import announce, device_from, is_cuda_fatal, set_seed, short_error, synchronize, task_from

_LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _OutOfMemory(Exception):
    """The device (or host) ran out of memory: a fact about this machine's load at that moment, not about the task."""


_OUT_OF_MEMORY_MARKERS = ("out of memory", "alloc_failed", "cudaerrormemoryallocation", "can't allocate memory")


def _stop_if_out_of_memory(error: BaseException) -> None:
    if isinstance(error, _OutOfMemory):
        raise error
    if isinstance(error, MemoryError) or any(marker in str(error).lower() for marker in _OUT_OF_MEMORY_MARKERS):
        raise _OutOfMemory(short_error(error, 300)) from error


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
    """Whether this process's CUDA work goes through an MPS daemon named in its environment (kbverify.mps)."""
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
        from kbverify import hidden
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


def _set_id(shape: str, distribution: str, weights: str, seed_index: int) -> str:
    return f"{shape}/{distribution}/{weights}/s{seed_index}"


def _copy_tf32(record: dict, source: str, target: str) -> dict | None:
    if source in record["tf32"]:
        record["tf32"][target] = copy.deepcopy(record["tf32"][source])
    return record["tf32"].get(target)


class _FamilyContext:
    """What the null kernels and the TF32 baseline need to re-run a set: namespace, model, device."""

    def __init__(self, namespace, model, device):
        self.namespace = namespace
        self.model = model
        self.device = device
        self._low_precision: dict = {}

    def inputs(self, meta: dict) -> list:
        return set_inputs(self.namespace, meta, self.device)

    def call(self, model, inputs, meta) -> list:
        set_seed(derive_seed(str(meta["seed"]), "call"))
        with torch.no_grad():
            output = flatten_outputs(model(*inputs))
        synchronize(self.device)
        return output

    def low_precision_model(self, name: str):
        if name not in self._low_precision:
            self._low_precision[name] = copy.deepcopy(self.model).to(_LOW_PRECISION[name])
        return self._low_precision[name]


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


def _tf32_summary(context: _FamilyContext, meta: dict, output: list, record: dict) -> dict | None:
    """The TF32 baseline's error against the exact reference on this set (GPU only, computed once)."""
    if context.device.type != "cuda":
        return None
    if meta["set_id"] not in record["tf32"]:
        set_tf32(matmul=True, cudnn=True)
        try:
            baseline = context.call(context.model, context.inputs(meta), meta)
        finally:
            set_tf32(matmul=False, cudnn=False)
        record["tf32"][meta["set_id"]] = summarize(output, baseline)
    return record["tf32"][meta["set_id"]]


# ---- null kernels ------------------------------------------------------------------------------------------

class _NullKernels:
    def __init__(self, names, protocols, low_precision_seeds: int, *, judged_by: dict | None = None,
                 screened: bool = True):
        """`judged_by`: kernel → the names of the protocols the parent judges it by (default: all of them);
        `screened`: try `correctness.screen` before each full comparison (off only to show it changes nothing)."""
        self.names = list(names)
        self.low_precision_seeds = low_precision_seeds
        self.protocols = protocols
        every = {p.name for p in protocols}
        judged_by = judged_by or {}
        self.alive = {name: every & set(judged_by.get(name, every)) for name in self.names}
        self.checks: dict[str, list] = {name: [] for name in self.names}
        self.notes: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.screened = screened

    def wants_previous(self) -> bool:
        """Whether a kernel built from another seed's output can still be checked."""
        return any(self.alive.get(name) for name in ("other_seed", "other_seed_mean"))

    def check(self, context: _FamilyContext, meta: dict, output: list, previous: list | None, record: dict):
        covering = [p for p in self.protocols if covers(p, meta["shape"], meta["distribution"], meta["weights"])]
        for name in self.names:
            live = [p for p in covering if p.name in self.alive[name]]
            if not live:
                continue
            if name in _LOW_PRECISION and meta["seed_index"] >= self.low_precision_seeds:
                # Reported only, never a reason to exclude a task, and the costliest null kernel (a second model
                # in bf16/fp16 and a full comparison per set): the first seeds of every (shape, distribution,
                # weights) set are its evidence; `sets_checked` in the report says how many sets that was.
                continue
            announce(f"audit:null:{name}:{meta['set_id']}")
            try:
                candidate = self._output(name, context, meta, output, previous)
            except BaseException as error:  # noqa: BLE001 - a null kernel that cannot run passes nothing
                _stop_if_out_of_memory(error)
                self.errors[name] = f"{meta['set_id']}: " + short_error(error, 300)
                self.alive[name].clear()
                if is_cuda_fatal(error):
                    raise
                continue
            if isinstance(candidate, str):
                self.notes[name] = candidate
                self.alive[name].clear()
                continue
            if candidate is None:
                continue
            baseline = None
            if any(p.rule == "verified" for p in live):
                baseline = _tf32_summary(context, meta, output, record)
            sample = screen(output, candidate) if self.screened else None
            if sample is not None and all(certainly_rejects(sample, baseline, p) for p in live):
                # Every protocol still alive rejects it whatever the elements not sampled hold: the full comparison
                # could only confirm that. The parent counts a screened check as failed (the protocols not alive
                # here had failed before).
                del candidate
                self.checks[name].append({"set_id": meta["set_id"], "screened": sample})
                self.alive[name].difference_update(p.name for p in live)
                continue
            summary = summarize(output, candidate)
            del candidate
            self.checks[name].append({"set_id": meta["set_id"], "summary": summary})
            for protocol in live:
                if judge_set(summary, baseline, protocol)[0] != "passed":
                    self.alive[name].discard(protocol.name)

    def replay(self, meta: dict, source_id: str, record: dict) -> None:
        """`check` on a set whose reference output and inputs are those of set `source_id`, checked before: every
        kernel still live here was live there too (a protocol covering a re-randomised set covers the default one,
        and kernels only lose protocols), passed there, and so was compared in full there (a screen that rejects
        every live protocol rejects one that passed). Running it would repeat that comparison; its result is
        copied and judged again, the TF32 baseline with it."""
        covering = [p for p in self.protocols if covers(p, meta["shape"], meta["distribution"], meta["weights"])]
        for name in self.names:
            live = [p for p in covering if p.name in self.alive[name]]
            if not live or (name in _LOW_PRECISION and meta["seed_index"] >= self.low_precision_seeds):
                continue
            source = next((c for c in self.checks[name] if c["set_id"] == source_id), None)
            if source is None:  # no candidate there (another seed's output on the first seed): none here
                continue
            baseline = None
            if any(p.rule == "verified" for p in live):
                baseline = _copy_tf32(record, source_id, meta["set_id"])
            check = {**copy.deepcopy(source), "set_id": meta["set_id"]}
            self.checks[name].append(check)
            for protocol in live:
                if "screened" in check or judge_set(check["summary"], baseline, protocol)[0] != "passed":
                    self.alive[name].discard(protocol.name)

    def abandon(self, reason: str) -> None:
        """Stop every null kernel still running: a comparison failed, so none of them can be judged."""
        for name in self.names:
            if self.alive[name]:
                self.errors.setdefault(name, reason)
                self.alive[name].clear()

    def _output(self, name, context, meta, output, previous):
        """The null kernel's output for this set; None: not applicable here; a string: never applicable."""
        if name == "zeros":
            return [torch.zeros_like(t) for t in output]
        if name == "ones":
            return [torch.ones_like(t) for t in output]
        if name == "input":
            if len(output) != 1:
                return "the reference returns several outputs"
            for value in context.inputs(meta):
                if isinstance(value, torch.Tensor) and value.shape == output[0].shape:
                    return [value.to(output[0].dtype)]
            return "no input has the output's shape"
        if name in ("other_seed", "other_seed_mean"):
            if previous is None:
                return None
            if name == "other_seed":
                return previous
            return [torch.full_like(t, _mean(t)) if t.numel() else t for t in previous]
        if name in _LOW_PRECISION:
            dtype = _LOW_PRECISION[name]
            inputs = [v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for v in context.inputs(meta)]
            result = context.call(context.low_precision_model(name), inputs, meta)
            return [r.to(o.dtype) if isinstance(r, torch.Tensor) and isinstance(o, torch.Tensor) else r
                    for r, o in zip(result, output)]
        raise ValueError(f"unknown null kernel {name!r}")

    def export(self) -> dict:
        return {name: {"checks": self.checks[name], "note": self.notes.get(name, ""),
                       "error": self.errors.get(name, ""), "alive_at_end": sorted(self.alive[name])}
                for name in self.names}


# ---- dead inputs and parameters ----------------------------------------------------------------------------

def _dead_check(namespace, settings: dict, device) -> dict:
    """One backward pass of a random projection of the output finds inputs and parameters with (near) zero
    gradient; each such candidate is then perturbed for real, on a few seeds, and the output change measured."""
    model = build_reference(namespace, settings["weight_seed"], "default", device, True)[0]
    seeds = settings["input_seeds"][:settings["perturbation_seeds"]]
    metas = [{"seed": seed, "distribution": "x1"} for seed in seeds]
    context = _FamilyContext(namespace, model, device)
    gradient = _gradient_sensitivity(context, metas[0])
    threshold = settings["dead_candidate_sensitivity"]
    candidates = [item for item in gradient["inputs"] + gradient["parameters"]
                  if item["sensitivity"] is None or not item["sensitivity"] > threshold]
    limit = settings["max_perturbations"]
    result = {"gradient_error": gradient["error"], "candidate_threshold": threshold,
              "inputs": gradient["inputs"], "parameters": gradient["parameters"],
              "perturbed": [], "truncated": max(0, len(candidates) - limit)}
    parameters = dict(model.named_parameters())
    for item in candidates[:limit]:
        announce(f"audit:dead:{item['kind']}:{item['name']}")
        result["perturbed"].append(_perturb(context, metas, item, parameters))
    return result


def _gradient_sensitivity(context: _FamilyContext, meta: dict) -> dict:
    """Estimated relative output change for a perturbation of each input and parameter at its own scale:
    ‖∂⟨out, r⟩/∂θ‖·rms(θ)/‖out‖ for a random projection r. None where no gradient could be taken.

    This backward is the audit's largest moment for most big tasks (ten input-sized tensors on an element-wise
    one), so it holds no more than it must: the leaves are the drawn inputs themselves (detached aliases, which
    nothing writes to), the model gets clones only if it works in place on its inputs, the outputs are gone
    before the backward, and r is drawn again there instead of being kept (_Projection) — the gradients are the
    same numbers as with a stored r."""
    drawn = context.inputs(meta)
    leaves = [v.detach().requires_grad_(True) if _is_float(v) else None for v in drawn]
    kinds = [(index, str(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__)
             for index, v in enumerate(drawn) if isinstance(v, torch.Tensor)]
    inputs = [leaf if leaf is not None else value for leaf, value in zip(leaves, drawn)]
    del drawn
    # each input's scale before the model runs: one that writes to its input behind autograd's back changes it
    scales = [_rms(leaf.detach()) if leaf is not None else None for leaf in leaves]
    parameters = [(name, p) for name, p in context.model.named_parameters() if p.is_floating_point()]
    for _, parameter in parameters:
        parameter.grad = None
    error = ""
    output_norm = 0.0
    try:
        with torch.enable_grad():
            outputs = _forward_on_leaves(context, meta, leaves, inputs)
            differentiable = [o for o in outputs if _is_float(o) and o.requires_grad]
            del outputs
            if not differentiable:
                error = "no differentiable output"
            else:
                generator = torch.Generator(device=context.device).manual_seed(derive_seed("audit", "projection"))
                # A scalar loss, not backward(outputs, grad_tensors=r): explicit gradients make torch import
                # sympy (its shape check), a quarter of a second in every audit process.
                loss = sum(_Projection.apply(o, generator) for o in differentiable)
                output_norm = math.sqrt(sum(_norm(o.detach()) ** 2 for o in differentiable))
                del differentiable
                loss.backward()
    except BaseException as error_:  # noqa: BLE001 - no gradient: every input and parameter is a candidate
        _stop_if_out_of_memory(error_)
        if is_cuda_fatal(error_):
            raise
        error = short_error(error_, 300)

    def sensitivity(scale, grad):
        if error or grad is None or output_norm == 0.0:
            return None
        estimate = _norm(grad) * (scale or 1.0) / output_norm
        return estimate if math.isfinite(estimate) else None

    found_inputs = [{"kind": "input", "index": index, "name": f"input {index}", "dtype": dtype,
                     "sensitivity": (sensitivity(scales[index], leaves[index].grad)
                                     if leaves[index] is not None else None)}
                    for index, dtype in kinds]
    found_parameters = [{"kind": "parameter", "name": name, "numel": parameter.numel(),
                         "sensitivity": sensitivity(_rms(parameter.detach()), parameter.grad)}
                        for name, parameter in parameters]
    for _, parameter in parameters:
        parameter.grad = None
    return {"inputs": found_inputs, "parameters": found_parameters, "error": error}


def _forward_on_leaves(context: _FamilyContext, meta: dict, leaves: list, inputs: list) -> list:
    """The model on the leaves themselves. One that works in place on an input is refused that by autograd on a
    leaf, possibly after it has already written to an input some other way: it runs again on fresh draws of the
    same seed, cloned, whose leaves replace `leaves`' entries (so the gradients land where the caller reads them)."""
    try:
        set_seed(derive_seed(str(meta["seed"]), "call"))
        return flatten_outputs(context.model(*inputs))
    except RuntimeError as error:
        if "leaf Variable that requires grad" not in str(error):
            raise
    fresh = context.inputs(meta)
    for index, value in enumerate(fresh):
        if leaves[index] is not None:
            leaves[index] = value.detach().requires_grad_(True)
            fresh[index] = leaves[index].clone()
    set_seed(derive_seed(str(meta["seed"]), "call"))
    return flatten_outputs(context.model(*fresh))


class _Projection(torch.autograd.Function):
    """⟨o, r⟩ for r ~ N(0, 1) drawn from `generator`, whose gradient with respect to o is r: r is drawn in the
    forward (to advance the generator as a stored draw would) and dropped, then drawn again from the saved state
    in the backward, so the backward holds one copy of it, as the gradient, and nothing else of o's size."""

    @staticmethod
    def forward(ctx, o, generator):
        ctx.state, ctx.shape, ctx.dtype = generator.get_state(), o.shape, o.dtype
        ctx.device = o.device
        r = torch.randn(o.shape, generator=generator, device=o.device, dtype=o.dtype)
        return r.mul_(o).sum()  # in place: r is this function's own, and no o-sized product is kept

    @staticmethod
    def backward(ctx, grad):
        generator = torch.Generator(device=ctx.device)
        generator.set_state(ctx.state)
        r = torch.randn(ctx.shape, generator=generator, device=ctx.device, dtype=ctx.dtype)
        return r.mul_(grad), None


def _perturb(context: _FamilyContext, metas: list, item: dict, parameters: dict) -> dict:
    """Change one input or parameter substantially and measure how much the output moves, per seed."""
    entry = {"kind": item["kind"], "name": item["name"], "runs": []}
    if item["kind"] == "input":
        entry["index"] = item["index"]
    for meta in metas:
        inputs = context.inputs(meta)
        base = context.call(context.model, inputs, meta)
        if item["kind"] == "input":
            changed = _perturbed_input(context, meta, item["index"], inputs)
            if changed is None:
                entry["runs"].append({"seed": meta["seed"], "skipped": "the input does not change across seeds"})
                continue
            fresh = context.inputs(meta)
            fresh[item["index"]] = changed
            after = context.call(context.model, fresh, meta)
        else:
            parameter = parameters[item["name"]]
            saved = parameter.detach().clone()
            generator = torch.Generator(device=parameter.device).manual_seed(derive_seed(item["name"], meta["seed"]))
            with torch.no_grad():
                parameter.add_(torch.randn(parameter.shape, generator=generator, device=parameter.device,
                                           dtype=parameter.dtype) * (_rms(saved) or 1.0))
            try:
                after = context.call(context.model, context.inputs(meta), meta)
            finally:
                with torch.no_grad():
                    parameter.copy_(saved)
        diff_norm, ref_norm, max_abs = _diff_norms(base, after)
        entry["runs"].append({"seed": meta["seed"], "diff_norm": diff_norm, "ref_norm": ref_norm,
                              "max_abs_diff": max_abs})
    return entry


def _perturbed_input(context, meta, index, inputs):
    """Input `index` from another seed's draw (keeps its dtype and structure: masks, indices); a floating
    input that does not vary with the seed gets noise at its own scale instead."""
    original = inputs[index]
    other = context.inputs({**meta, "seed": derive_seed(str(meta["seed"]), "perturb")})[index]
    if not isinstance(other, torch.Tensor) or other.shape != original.shape or other.dtype != original.dtype:
        return None
    if not torch.equal(other, original):
        return other
    if not original.is_floating_point():
        return None
    generator = torch.Generator(device=original.device).manual_seed(derive_seed(str(meta["seed"]), "noise", index))
    noise = torch.randn(original.shape, generator=generator, device=original.device, dtype=original.dtype)
    return original + noise * (_rms(original) or 1.0)


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

def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _as_float(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


# A float64 copy of a whole output (what `dtype=torch.float64` makes in a norm or a mean) is 12 GB at 1.6·10⁹
# elements, and several audits share a GPU: tensors above CHUNK_ELEMENTS are reduced chunk by chunk. Below it the
# numbers are computed as they always were, bit for bit; above it, sums in another order differ from a one-shot
# float64 reduction by rounding only (measured: 1e-13 relative on 10⁸ elements, against thresholds of 1e-5 and up).

def _float_chunks(t: torch.Tensor):
    """`_as_float(t)` in consecutive pieces of the flattened tensor, none copied whole."""
    flat = t.detach().reshape(-1)
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield _as_float(flat[start:start + CHUNK_ELEMENTS])


def _norm64(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t, dtype=torch.float64))


def _norm(t: torch.Tensor) -> float:
    if not t.numel():
        return 0.0
    if t.numel() <= CHUNK_ELEMENTS:
        return _norm64(_as_float(t))
    return math.sqrt(sum(_norm64(chunk) ** 2 for chunk in _float_chunks(t)))


def _difference_norm(x: torch.Tensor, y: torch.Tensor) -> float:
    """‖y − x‖ of two tensors of one shape."""
    if x.numel() <= CHUNK_ELEMENTS:
        return _norm(_as_float(y) - _as_float(x))
    return math.sqrt(sum(_norm64(b - a) ** 2 for a, b in zip(_float_chunks(x), _float_chunks(y))))


def _mean(t: torch.Tensor) -> float:
    """The mean in float64 (`t.double().mean()`), of any dtype."""
    if t.numel() <= CHUNK_ELEMENTS:
        return float(t.double().mean())
    flat = t.detach().reshape(-1)
    total = sum(float(flat[start:start + CHUNK_ELEMENTS].double().sum())
                for start in range(0, flat.numel(), CHUNK_ELEMENTS))
    return total / t.numel()


def _rms(t: torch.Tensor) -> float:
    return _norm(t) / math.sqrt(t.numel()) if t.numel() else 0.0


def _largest_range(x: torch.Tensor, dim: int) -> float:
    """max over the other axes of (max − min along `dim`): one pass for both extremes, the same numbers as
    `amax` and `amin` apart (both are exact)."""
    low, high = torch.aminmax(x, dim=dim)
    return float((high - low).max())


def _nan_max(a: float, b: float) -> float:
    return b if math.isnan(b) or b > a else a


def _max_abs_diff(a: list, b: list, identical: frozenset = frozenset()) -> float:
    """Largest element-wise difference between two outputs; inf when their structure differs. The tensors at the
    indices in `identical` are known equal and finite: they add 0, which changes no maximum."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for index, (x, y) in enumerate(zip(a, b)):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
                worst = math.inf
            continue
        if x.shape != y.shape:
            return math.inf
        if x.numel() and index not in identical:
            for first, second in zip(_float_chunks(x), _float_chunks(y)):
                worst = _nan_max(worst, float((first - second).abs().max()))
    return worst


def _diff_norms(a: list, b: list) -> tuple[float, float, float]:
    """(‖b − a‖, ‖a‖, max|b − a|) over every tensor of the two outputs."""
    if len(a) != len(b) or any(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape != y.shape
                               for x, y in zip(a, b)):
        return math.inf, 0.0, math.inf
    diff_sq = ref_sq = 0.0
    identical = set()
    for index, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.numel():
            ref_norm = _norm(x)
            # A deterministic reference run twice: equal element for element and finite (a finite norm has no inf
            # or NaN in it), every difference is +0, so ‖y − x‖ = 0 and max|y − x| = 0 without computing them.
            if math.isfinite(ref_norm) and x.dtype == y.dtype and torch.equal(x, y):
                identical.add(index)
            else:
                diff_sq += _difference_norm(x, y) ** 2
            ref_sq += ref_norm ** 2
    return math.sqrt(diff_sq), math.sqrt(ref_sq), _max_abs_diff(a, b, frozenset(identical))


_FRACTION_STATS = ("mean", "frac_near_zero", "frac_near_mean")


def _tensor_stats(t, *, fractions: bool = True) -> dict:
    """What the thresholds need from one output tensor: magnitude, the largest range along each axis, and with
    `fractions` the mean and the near-zero and near-mean fractions."""
    if not isinstance(t, torch.Tensor):
        return {"type": type(t).__name__}
    stats = {"shape": list(t.shape), "dtype": str(t.dtype), "numel": t.numel()}
    if not t.numel():
        stats["nonfinite"] = 0
        return stats
    x = _as_float(t)
    chunks = list(_float_chunks(x))
    largest, near_zero = [], {a: 0 for a in NEAR_ATOLS}
    for chunk in chunks:
        magnitude = chunk.abs()
        largest.append(float(magnitude.max()))  # NaN where the chunk has one: max propagates NaN
        for atol in NEAR_ATOLS if fractions else ():
            near_zero[atol] += int(torch.count_nonzero(magnitude <= atol))
        del magnitude
    if not all(math.isfinite(value) for value in largest):
        stats["nonfinite"] = sum(int(torch.count_nonzero(~torch.isfinite(chunk))) for chunk in chunks)
        return stats
    stats["nonfinite"] = 0  # the largest magnitude is finite, so every element is
    stats["max_abs"] = max(largest)
    stats["axis_range"] = [_largest_range(x, d) if size > 1 else None for d, size in enumerate(t.shape)]
    if not fractions:
        return stats
    mean = float(x.mean(dtype=torch.float64)) if x.numel() <= CHUNK_ELEMENTS else _mean(x)
    near_mean = {a: 0 for a in NEAR_ATOLS}
    for chunk in chunks:
        deviation = (chunk - mean).abs_()
        for atol in NEAR_ATOLS:
            near_mean[atol] += int(torch.count_nonzero(deviation <= atol))
        del deviation
    stats["mean"] = mean
    stats["frac_near_zero"] = {repr(a): near_zero[a] / t.numel() for a in NEAR_ATOLS}
    stats["frac_near_mean"] = {repr(a): near_mean[a] / t.numel() for a in NEAR_ATOLS}
    return stats
