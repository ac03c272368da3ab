"""Timing in the worker: raw samples only; every statistic is recomputed by the parent (SPEC §5).

Interleaved method: rounds in which the reference and the candidate each make a few calls, in a random order per
round. Every call gets a new input draw made outside the timed pair (sometimes copied into the previous call's
tensors, which defeats pointer-keyed caches), the L2 is flushed before it, and the CUDA events sit stream-ordered
right around it. Guards ride along: a secret random projection of each output taken stream-ordered right after the
call and again after a device-wide synchronise; a second end event after that synchronise; thread counts; the
baseline's flags and torch functions re-checked before every reference call.
"""

from __future__ import annotations

import gc
import json
import os
import random
import time

import torch

from kbverify.child import guards
from kbverify.child.evaluate import build_reference, construct_candidate, in_protocol_mode, shape_namespaces
from kbverify.child.precision import assert_baseline_flags, set_tf32, tf32_state
from kbverify.child.timed_call import _SLEEP, KINDS, _timed_call, flush_buffer
from kbverify.child.timed_call import Cover as _Cover
from kbverify.child.extensions import ExtensionWatch
from kbverify.child.worker import (announce, compile_untrusted, device_from, set_seed, short_error,
                                   synchronize, task_from)
from kbverify.correctness import flatten_outputs
from kbverify.inputs import derive_seed, draw_inputs, timed_inputs
from kbverify.status import Warn

CALLS_PER_SIDE = 3
# Captured when the worker loads, before any submission: `secrets.randbits`, `os.urandom` and `random.Random` are
# module attributes a submission could replace to make the timed inputs or the round order predictable.
_URANDOM = os.urandom
_RANDOM = random.Random


def _random_bits(bits: int) -> int:
    return int.from_bytes(_URANDOM((bits + 7) // 8), "little") & ((1 << bits) - 1)




class _Side:
    def __init__(self, name: str, model, namespace: dict, device, secret: str, grad: bool):
        self.name, self.model, self.namespace, self.device = name, model, namespace, device
        self.secret, self.grad = secret, grad
        # projection done → device idle: work the call left running beyond its own stream (the projection's
        # own launches are excluded, or a call faster than the host's launch overhead would look unfinished)
        self.settle_gaps_ms: list[float] = []
        self.calls: list[dict] = []
        self.previous_inputs: list | None = None
        self.threads_started = 0
        self.host_ms: list[float] = []  # hold → end event on the host: what the device-side hold has to cover
        self.probe: list[list[float]] = []  # warm-up: [hold ms, host ms] per call (is the forward blocked?)
        self.uncovered = 0  # calls whose host work outlasted the hold (their launch overhead was timed)
        self.phase_ns: dict[str, int] = {}  # host wall time per phase of the harness's work, summed over calls
        self.modes_left: set[str] = set()  # torch modes a call entered and did not leave
        self.batch: dict[int, dict] = {}  # this batch's calls: index → projections and output signature
        # Only the reference's own weights are spared the poison: a candidate returning a tensor it keeps (a
        # registered buffer included) must recompute it every call, and its `parameters()` is its own to fake.
        self.own_storages = _own_storages(model) if name == "ref" and isinstance(model, torch.nn.Module) else frozenset()
        self._seen = 0
        self.jitter_bytes = 0  # > 0: a spacer of up to this many bytes allocated before each call's tensors
        self.spacer = None

    def spent(self, phase: str, since_ns: int) -> int:
        """Add the time since `since_ns` to `phase`; returns now, the next phase's start."""
        now = time.perf_counter_ns()
        self.phase_ns[phase] = self.phase_ns.get(phase, 0) + now - since_ns
        return now

    def keep(self, call_index: int, projections: list, signature: list) -> None:
        """Held until the parent has chosen which of this batch's calls it checks (kbverify.timing_control):
        the projections' raw bytes, so what is revealed hashes exactly as what was committed to."""
        self.batch[call_index] = {"projections": [None if p is None else _raw(p) for p in projections],
                                  "signature": json.loads(json.dumps(signature))}

    def inputs_for(self, seed: int, distribution: str = "x1") -> tuple[int, list]:
        """The parent chose the seed and the distribution and sends them with the batch: nothing in this process
        predicts the next."""
        return seed, timed_inputs(self.namespace, seed, distribution, self.device)

    def place(self, staged: list) -> list:
        """The call's own input tensors, filled from a finished draw by copies enqueued now (after the hold):
        a kernel that starts on another stream without waiting reads the last call's values, not this call's.
        Half the time the previous call's tensors are refilled, which defeats caches keyed on a tensor's address.
        Lists and tuples are refilled element by element; a tensor that shares its storage with another input
        (an alias, a view), a tensor subclass or a Parameter, and anything that is not a tensor go to the call
        as drawn. The caller keeps `staged` alive until the call is over, so no allocation made inside the call
        can be handed the drawn values' memory."""
        previous = self.previous_inputs
        if self.jitter_bytes:
            # Spacer first, then the call's allocations: each lands at another offset in the allocator's
            # segments. Two copies of one model differed by a fixed 0.7-1% for a whole run on the H200 (stable
            # addresses, call after call, are the first suspect); moved every call, that offset is noise the
            # rounds average and the interval sees. Experimental: off unless the payload asks for it.
            self.spacer = None
            self.spacer = torch.empty(_random_bits(32) % self.jitter_bytes // 512 * 512 + 512, dtype=torch.uint8,
                                      device=self.device)
        reuse = previous is not None and _random_bits(1) == 1 and _layout(previous) == _layout(staged)
        if not reuse:
            self.previous_inputs = previous = None  # freed first: at most two copies of the inputs exist at once
        shared = _shared_storages(staged)
        placed = [_refill(value, previous[index] if reuse else None, shared) for index, value in enumerate(staged)]
        self.previous_inputs = placed
        return placed


def _refill(value, previous, shared: frozenset):
    if type(value) in (list, tuple):
        earlier = previous if type(previous) is type(value) and len(previous) == len(value) else [None] * len(value)
        return type(value)(_refill(item, before, shared) for item, before in zip(value, earlier))
    if not _refillable(value, shared):
        return value
    target = previous if isinstance(previous, torch.Tensor) else torch.empty_strided(
        value.size(), value.stride(), dtype=value.dtype, device=value.device)
    with torch.no_grad():
        target.copy_(value)
    if value.requires_grad and not target.requires_grad:
        target.requires_grad_(True)
    return target


def _refillable(value, shared: frozenset) -> bool:
    if type(value) is not torch.Tensor or value.numel() == 0 or _storage_of(value) in shared:
        return False
    return _dense(value)


def _dense(tensor: torch.Tensor) -> bool:
    """Its elements fill its memory exactly once in some order of dimensions (contiguous, transposed, channels-last):
    an empty_strided copy then has the same layout. A slice with gaps or a broadcast (stride 0) is not."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _shared_storages(values) -> frozenset:
    seen, shared = set(), set()
    for tensor in _tensors_in(values):
        storage = _storage_of(tensor)
        (shared if storage in seen else seen).add(storage)
    return frozenset(shared)


def _tensors_in(values):
    for value in values:
        if type(value) in (list, tuple):
            yield from _tensors_in(value)
        elif isinstance(value, torch.Tensor):
            yield value


def _layout(value):
    """What a refill must match: the nesting, and each tensor's shape, strides, dtype and whether it needs grad."""
    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(_layout(item) for item in value))
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value).__name__, tuple(value.shape), tuple(value.stride()), value.dtype,
                value.requires_grad)
    return ("value",)


class _Projector:
    """Secret random projections of a secret sample of each output's elements.

    Four projections estimate the norm-wise error of a timed output against the reference's on the same inputs
    (mean square of the differences ≈ ‖c − r‖² over the sample), without keeping outputs around; the kernel cannot
    know which elements are looked at, so a partial or stale result is caught unless nearly all of it is right.
    """

    COUNT = 4
    SAMPLE = 1 << 20

    def __init__(self, secret: str, device):
        self.secret, self.device, self.plans = secret, device, {}

    def _plan(self, index: int, out: torch.Tensor):
        key = (index, tuple(out.shape))
        if key not in self.plans:
            generator = torch.Generator(device=self.device).manual_seed(derive_seed(self.secret, "proj", key))
            numel = out.numel()
            count = min(numel, self.SAMPLE)
            positions = (torch.randperm(numel, generator=generator, device=self.device)[:count] if numel <= 4 * count
                         else torch.randint(0, numel, (count,), generator=generator, device=self.device))
            weights = torch.randn((self.COUNT, count), generator=generator, device=self.device, dtype=torch.float64)
            self.plans[key] = (positions, weights)
        return self.plans[key]

    EXACT = 4096  # elements kept as they are, for an exact norm-wise error on checked calls

    def __call__(self, outputs: list) -> list:
        values = []
        for index, out in enumerate(outputs):
            if type(out) is not torch.Tensor or out.numel() == 0:  # a subclass's __torch_function__ never runs
                values.append(None)
                continue
            positions, weights = self._plan(index, out)
            # take() reads the sampled elements in place, whatever the strides: the projection costs the same for
            # a non-contiguous output as for a contiguous one (reshape would copy the whole output first)
            sample = out.detach().take(positions).double()
            values.append(torch.cat([weights @ sample, torch.linalg.vector_norm(sample).reshape(1),
                                     sample[: self.EXACT]]))
        return values


def timing_job(payload: dict) -> dict:
    device = device_from(payload)
    task = task_from(payload)
    secret = payload["secret"]
    train = bool(payload.get("train_mode", True))
    aa = bool(payload.get("aa", False))
    record: dict = {"warnings": []}

    announce("reference:load")
    namespace = shape_namespaces(task, [{"shape": "original", "overrides": {}}])["original"]
    set_tf32(matmul=bool(payload.get("baseline_matmul_tf32", True)),
             cudnn=bool(payload.get("baseline_cudnn_tf32", True)))
    flags = tf32_state()
    sensitive = guards.snapshot_sensitive()
    torch_functions = guards.snapshot_torch_namespace()
    modes_at_load = guards.mode_depths()
    weight_seed = derive_seed(secret, "timing-weights")
    reference, _ = build_reference(namespace, weight_seed, "default", device, train)

    if aa:
        candidate = build_reference(namespace, weight_seed, "default", device, train)[0]
        watch = None
    else:
        announce("candidate:load")
        watch = ExtensionWatch().install()
        # A second execution of the task: the submission must not reach the reference's class or globals.
        own_task = shape_namespaces(task, [{"shape": "original", "overrides": {}}])["original"]
        cand_namespace = {k: v for k, v in own_task.items() if not k.startswith("__")}
        cand_namespace["__name__"] = "kbverify_submission"
        try:
            exec(compile_untrusted(payload["submission_source"]), cand_namespace)
            set_seed(weight_seed)
            def reseed() -> list:
                set_seed(weight_seed)
                return own_task["get_init_inputs"]()

            built = construct_candidate(cand_namespace["ModelNew"], own_task["get_init_inputs"](),
                                        reference.state_dict(), reseed=reseed)[0]
            candidate = in_protocol_mode(built.to(device), train)
        except BaseException as error:  # noqa: BLE001
            return {**record, "load_error": short_error(error)}
    record["flags_changed_at_import"] = {key: value for key, value in tf32_state().items() if flags.get(key) != value}
    record["torch_functions_changed"] = guards.torch_namespace_changes(torch_functions)

    sides = {"ref": _Side("ref", reference, namespace, device, secret, grad=False),
             "cand": _Side("cand", candidate, namespace, device, secret,
                           grad=bool(payload.get("candidate_grad_enabled", False)))}
    reference_model = reference
    for side in sides.values():
        side.jitter_bytes = int(payload.get("placement_jitter_bytes", 0))
    projector = _Projector(secret, device)
    flush = flush_buffer(device)
    # torch.cuda._sleep is private API: without it the launch race is back, and the record says so
    cover = _Cover(device) if device.type == "cuda" and _SLEEP is not None else None
    if device.type == "cuda" and cover is None:
        record["warnings"].append(Warn.NO_DEVICE_HOLD.value)
    flag_changes: list[dict] = []

    def reassert():
        now = tf32_state()
        if now != flags and len(flag_changes) < 5:
            flag_changes.append({key: value for key, value in now.items() if flags.get(key) != value})
        assert_baseline_flags(flags)

    announce("timing:warmup")
    try:
        _warm_up(sides, device, flush, projector, reassert, cover, seconds=float(payload.get("warmup_s", 0.2)))
        if cover is not None:
            cover.settle()
        # Everything built so far (torch, the models, the warm-up's objects) out of the collector's reach: a full
        # collection over it between calls stalls the host for milliseconds, both sides alike, but the rounds are
        # what the time budget buys.
        sm_clock = _SmClock(device)
        gc.collect()
        gc.freeze()
        announce("timing:rounds")
        record["timing_s"] = _serve_batches(sides, device, flush, projector, reassert, cover, sm_clock)
        record["signature"] = _reference_signature(reference_model, namespace, device)
    except BaseException as error:  # noqa: BLE001 - who raised decides whose failure it is
        record["error"] = short_error(error)
        record["error_side"] = "reference" if _last_phase_is_reference() else "candidate"
    record["settle_gaps_ms"] = {name: side.settle_gaps_ms for name, side in sides.items()}
    record["threads_started"] = {name: side.threads_started for name, side in sides.items()}
    record["host_ms"] = {name: _quantiles(side.host_ms) for name, side in sides.items()}
    record["uncovered_calls"] = {name: side.uncovered for name, side in sides.items()}
    record["hold_probe"] = {name: side.probe for name, side in sides.items()} if cover is not None else None
    record["cover_ms"] = cover.length_ms if cover is not None else None
    record["phase_ms_per_call"] = {name: {phase: total / 1e6 / max(1, len(side.calls))
                                          for phase, total in side.phase_ns.items()}
                                   for name, side in sides.items()}
    record["cover_cycles_per_ms"] = cover.cycles_per_ms if cover is not None else None
    record["placement_jitter_bytes"] = sides["ref"].jitter_bytes
    record["unsettled"] = [c for c in sides["cand"].calls if c.get("unsettled")][:5]
    record["n_unsettled"] = sum(1 for c in sides["cand"].calls if c.get("unsettled"))
    record["flags_changed"] = flag_changes
    record["baseline_flags"] = flags
    modes_left = set(guards.modes_left_active(modes_at_load)).union(*(side.modes_left for side in sides.values()))
    record["tampered"] = guards.tampered(sensitive) + sorted(modes_left)
    record["torch_functions_changed"] = sorted(set(record["torch_functions_changed"])
                                               | set(guards.torch_namespace_changes(torch_functions)))
    record["extensions"] = watch.record() if watch else None
    record["input_bytes"], record["output_bytes"] = _moved_bytes(reference_model, namespace, device)
    record["peak_bandwidth_gbps"] = _bandwidth(device)
    record.update(_peak_memory(sides, device))
    return record


def _serve_batches(sides, device, flush, projector, reassert, cover, sm_clock) -> float:
    """The parent's rounds (kbverify.timing_control), one side's batch at a time: it names the side and each call's
    input seed, and reads the times back at once, bounded by its own clock around the batch. Each call's output
    projections are committed to (a hash per call) before the parent says which calls it checks, so they cannot
    be redone afterwards. Returns the seconds spent serving."""
    from kbverify.child import worker

    worker.send({"kind": "reply", "op": "ready"})
    models = {name: side.model for name, side in sides.items()}
    started = time.monotonic()
    pending: list = []
    while True:
        command = worker.receive_command()
        if command is None or command.get("op") == "end":
            return time.monotonic() - started
        if command.get("op") == "reveal":
            side = sides["cand"]
            chosen = {str(i): side.batch[i] for i in command.get("calls", []) if i in side.batch}
            worker.send({"kind": "reply", "op": "reveal", "calls": chosen})
            continue
        name = "ref" if command.get("side") == "ref" else "cand"
        kind = command.get("kind") if command.get("kind") in KINDS else "device"
        side = sides[name]
        side.batch = {}
        _check_sides(sides, models)
        announce("timing:reference" if name == "ref" else "candidate:timing")
        times = []
        seeds = command.get("seeds", [])
        distributions = command.get("distributions") or ["x1"] * len(seeds)
        for seed, distribution in zip(seeds, distributions):
            elapsed, seed, inputs, out, early = _timed_call(
                side, lambda side=side, seed=int(seed), d=str(distribution): side.inputs_for(seed, d), device, flush,
                projector, reassert if name == "ref" else None, cover, kind)
            del inputs
            times.append(elapsed)
            side.calls.append({"seed": seed})
            # Both sides get the same host work after every call, or the side whose host has just done more
            # launches its next call slower. Checked after the device-wide synchronise, before the next call can
            # touch its inputs (an output may legally be a view of them): work deferred past the call shows up
            # here. Then the output is poisoned: nothing of the reference's answer is left for the candidate to
            # find, and a candidate that hands back a tensor it keeps finds NaN in it next time.
            pending.append((len(side.calls) - 1, out, early))
            mark = time.perf_counter_ns()
            _settle(pending, projector, side, device)
            mark = side.spent("settle", mark)
            _poison(out, side.own_storages)
            side.spent("poison", mark)
            del out
        commits = {str(index): commitment(entry) for index, entry in side.batch.items()}
        worker.send({"kind": "reply", "op": "batch", "side": name, "batch_kind": kind, "times_ms": times,
                     "commits": commits,
                     "first_call": len(side.calls) - len(times), "sm_clock_mhz": sm_clock()})


def _raw(vector: torch.Tensor) -> str:
    import base64

    return base64.b64encode(vector.detach().to("cpu", torch.float64).contiguous().numpy().tobytes()).decode()


class HarnessChanged(RuntimeError):
    """The timing worker's own objects were changed from outside the harness (a frame walk from a forward)."""


def _check_sides(sides: dict, models: dict) -> None:
    """Before every batch: the sides are the harness's as it built them. Their objects are locals of the batch loop,
    which the tamper snapshot of module globals does not see, and a forward that walks its frames can reach
    them: a reference swapped for a slower one, a method shadowed on the instance (a draw that waits), a batch
    store that rewrites what is committed. In-process, so it raises the bar rather than closing the way."""
    if set(sides) != {"ref", "cand"} or type(sides) is not dict:
        raise HarnessChanged("the timing sides were replaced")
    for name, side in sides.items():
        if type(side) is not _Side or side.model is not models[name] or type(side.batch) is not dict:
            raise HarnessChanged(f"the {name} side's model, class or batch store was replaced")
        shadowed = [key for key in vars(side) if callable(getattr(_Side, key, None))]
        if shadowed:
            raise HarnessChanged(f"the {name} side's {shadowed[0]} was replaced on the instance")


def commitment(entry: dict) -> str:
    """What a call's projections and output signature hash to (kbverify.timing_control checks a revealed call
    against it: the same function, there)."""
    from kbverify.timing_control import commitment as same

    return same(entry)


def _quantiles(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50": at(0.5), "p90": at(0.9), "max": ordered[-1], "n": len(ordered)}


def _reference_signature(reference, namespace, device) -> list:
    with torch.no_grad():
        return _signature(flatten_outputs(reference(*draw_inputs(namespace, 0, device))))


def _last_phase_is_reference() -> bool:
    from kbverify.child import worker

    phase = worker.last_phase()
    return bool(phase) and not phase.startswith("candidate")


def _warm_up(sides, device, flush, projector, reassert, cover, *, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    calls = 0
    while calls < (4 if cover is not None else 3) or time.monotonic() < deadline:
        if cover is not None:  # long and short holds in turn, the same for both sides (kbverify.timing_modes)
            cover.probe_ms = cover.CAP_MS if calls % 2 == 0 else cover.PROBE_SHORT_MS
        for name, side in sides.items():
            announce("timing:reference-warmup" if name == "ref" else "candidate:warmup")
            seed = derive_seed(side.secret, name, "warmup", calls)
            _timed_call(side, lambda side=side, seed=seed: (seed, draw_inputs(side.namespace, seed, device)), device,
                        flush, projector, reassert if name == "ref" else None, cover)
        calls += 1
        if calls >= 50:
            break
    for side in sides.values():
        side.settle_gaps_ms.clear()
        side.host_ms.clear()
        side.phase_ns.clear()
        side.uncovered = 0
        side.previous_inputs = None


def _poison(output, spared: frozenset = frozenset()) -> None:
    """NaN into every floating output tensor, except one that shares storage with the model's own parameters or
    buffers (a forward may return one of them as it is)."""
    with torch.no_grad():
        for tensor in flatten_outputs(output):
            if (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and type(tensor) is torch.Tensor
                    and _storage_of(tensor) not in spared):
                tensor.fill_(float("nan"))


def _storage_of(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (a functional or meta tensor)
        return -1


def _own_storages(model) -> frozenset:
    try:
        tensors = [*model.parameters(), *model.buffers()]
    except Exception:  # noqa: BLE001 - a submission's module may not enumerate; then nothing is spared
        return frozenset()
    return frozenset(_storage_of(t) for t in tensors if isinstance(t, torch.Tensor))


def _signature(outputs: list) -> list:
    # the full type name: a subclass called "Tensor" is not torch.Tensor
    return [(f"{type(t).__module__}.{type(t).__qualname__}", tuple(t.shape), str(t.dtype))
            if type(t) is torch.Tensor else f"{type(t).__module__}.{type(t).__qualname__}" for t in outputs]


def _settle(pending: list, projector, side: _Side, device) -> None:
    synchronize(device)
    for call_index, out, early in pending:
        flat = flatten_outputs(out)
        late = projector(flat)
        call = side.calls[call_index]
        call["signature"] = signature = _signature(flat)
        both = _to_host([*early, *late])
        early, late = both[: len(early)], both[len(early):]
        changed = any((a is None) != (b is None) or (a is not None and not torch.equal(a, b)
                                                     and not bool(torch.isnan(a).any() and torch.isnan(b).any()))
                      for a, b in zip(early, late))
        if changed:
            call["unsettled"] = True
        side.keep(call_index, late, signature)
    pending.clear()


def _to_host(vectors: list) -> list:
    """Projection vectors (or None) to the host in one transfer: a copy and a compare per output each waited on
    the device, and this runs after every call on both sides."""
    present = [v for v in vectors if v is not None]
    if not present:
        return list(vectors)
    pieces = iter(torch.cat([v.reshape(-1) for v in present]).cpu().split([v.numel() for v in present]))
    return [None if v is None else next(pieces) for v in vectors]


STALE_SAMPLING_FACTOR = 1.1  # a 4096-element sample estimates a norm to about 1%: a small margin is enough


def _moved_bytes(reference, namespace, device) -> tuple[int, int]:
    """Bytes a call must at least read (its inputs) and write (its outputs), from the reference."""
    inputs = draw_inputs(namespace, 0, device)
    with torch.no_grad():
        outputs = flatten_outputs(reference(*inputs))
    size = lambda values: int(sum(x.numel() * x.element_size() for x in values if isinstance(x, torch.Tensor)))
    return size(inputs), size(outputs)


_BANDWIDTH_CACHE: dict = {}


def _bandwidth(device) -> float | None:
    """Measured device-memory copy bandwidth (GB/s), the denominator of the bytes-moved floor."""
    if device.type != "cuda":
        return None
    if "gbps" not in _BANDWIDTH_CACHE:
        source = torch.empty(1 << 28, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        target.copy_(source)
        torch.cuda.synchronize(device)
        best = float("inf")
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end))
        _BANDWIDTH_CACHE["gbps"] = 2 * source.numel() * 4 / (best / 1e3) / 1e9
        del source, target
    return _BANDWIDTH_CACHE["gbps"]


class _SmClock:
    """The SM clock, read once per round. `torch.cuda.clock_rate` initialises NVML and resolves the device on
    every call (with a GPU UUID in CUDA_VISIBLE_DEVICES it loads the NVML library and lists every GPU each
    time), so the handle is resolved once here; it is the first suspect for the 14-140 ms by which rounds
    outlasted their calls on the H200. Without the private helper, the public call as before."""

    def __init__(self, device):
        self._read = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            handle = torch.cuda._get_pynvml_handler(device)
            sm = pynvml.NVML_CLOCK_SM
            pynvml.nvmlDeviceGetClockInfo(handle, sm)
            self._read = lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, sm))
        except Exception:  # noqa: BLE001 - needs nvidia-ml-py and the private helper
            self._read = lambda: int(torch.cuda.clock_rate(device))

    def __call__(self) -> int | None:
        if self._read is None:
            return None
        try:
            return self._read()
        except Exception:  # noqa: BLE001
            return None


def _peak_memory(sides, device) -> dict:
    if device.type != "cuda":
        return {}
    peaks = {}
    for name, side in sides.items():
        inputs = draw_inputs(side.namespace, 1, device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            out = side.model(*inputs)
        torch.cuda.synchronize(device)
        peaks[name] = torch.cuda.max_memory_allocated(device) - base
        del out
    return {"peak_memory_bytes": peaks["cand"], "ref_peak_memory_bytes": peaks["ref"]}


def reference_timing_job(payload: dict) -> dict:
    """The reference alone in a clean process, same method: the check on an in-process baseline. The parent
    drives its rounds as it drives the candidate's (kbverify.timing_control) and keeps their times."""
    payload = {**payload, "aa": True}
    record = timing_job(payload)
    kept = ("error", "timing_s", "phase_ms_per_call", "cover_ms", "uncovered_calls", "hold_probe", "host_ms")
    return {key: record.get(key) for key in kept}
