"""The timing worker's warm-up and its service of the parent's rounds (kbverify.timing_control), batch by batch.

`_serve_batches`, `_calls` and `_warm_up` keep their names: they are the frames above every timed forward, and the adversarial
submissions of the tests (tests/corpus, tests/test_hang.py) find them by name.
"""

from __future__ import annotations

import gc
import time

import torch

from kbverify.child import guards
from kbverify.child.timed_call import KINDS, _timed_call
from kbverify.child.timing_sides import Projector, Side, output_signature, poison
from kbverify.child.worker import announce, synchronize
from kbverify.correctness import flatten_outputs
from kbverify.inputs import derive_seed, draw_inputs

def _serve_batches(sides, device, flush, projector, reassert, cover, sm_clock, *, lead_call: bool = True,
                   signals=None) -> float:
    """The parent's rounds (kbverify.timing_control), one side's batch at a time: it names the side, then starts
    its clock and sends each call's input seed, and reads the times back at once, bounded by that clock. Each
    call's output projections are committed to (a hash per call) before the parent says which calls it checks,
    so they cannot be redone afterwards. `signals`: the process's signal state before the submission loaded
    (guards.signal_state). Returns the seconds spent serving."""
    from kbverify.child import worker

    worker.send({"kind": "reply", "op": "ready"})
    models = {name: side.model for name, side in sides.items()}
    started = time.monotonic()
    threads = guards.python_thread_count()  # after the warm-up: a compiler's worker threads are there by now
    while True:
        command = worker.receive_command()
        if command is None or command.get("op") == "end":
            return time.monotonic() - started
        if command.get("op") == "reveal":
            side = sides["cand"]
            chosen = {str(i): side.batch[i] for i in command.get("calls", []) if i in side.batch}
            worker.send({"kind": "reply", "op": "reveal", "calls": chosen})
        elif command.get("op") == "batch":
            name = "ref" if command.get("side") == "ref" else "cand"
            sides[name].batch = {}
            _check_sides(sides, models, signals)
            _check_harness(projector, flush)
            if guards.python_thread_count() > threads:
                # A thread that outlives the call that started it can run inside the reference's batch: one holding
                # the GIL there padded the reference's share of the parent's clock (a red team's 2.7x for a 1x matmul)
                raise HarnessChanged(f"Python threads were started during the timed rounds "
                                     f"({guards.python_thread_count()} running, {threads} after the warm-up)")
            kind = command.get("kind") if command.get("kind") in KINDS else "device"
            times = _batch(sides[name], name, kind, device, flush, projector, reassert, cover, lead_call)
            if times is None:
                return time.monotonic() - started
            side = sides[name]
            commits = {str(index): commitment(entry) for index, entry in side.batch.items()}
            worker.send({"kind": "reply", "op": "batch", "side": name, "batch_kind": kind, "times_ms": times,
                         "commits": commits, "first_call": len(side.calls) - len(times), "sm_clock_mhz": sm_clock()})


def _batch(side, name: str, kind: str, device, flush, projector, reassert, cover, lead_call: bool) -> list | None:
    """One side's batch: its calls' times, or None if the parent's `go` never came.

    The seeds come with `go`, after the parent's clock has started: no code of the candidate's that runs before
    it (a lead call's forward, a finalizer freed with the last batch's store) can know the inputs and compute
    the outputs off the clock (a red team's 3x from a finalizer that read the seeds from the batch command). The
    draws are then harness work on the clock, the same for both sides. The collector stays off from before the
    clock starts until after it stops (a gc callback run in the reference's batch padded its share of that clock:
    a candidate 17x "faster"), and nothing that existed before the batch is freed inside it (the previous
    inputs go after `timed`): a finalizer on a reference tensor freed there padded it the same way (2.4x)."""
    from kbverify.child import worker

    announce("timing:reference" if name == "ref" else "candidate:timing")
    if kind == "host" and lead_call:
        _lead(side, device)
    collecting = gc.isenabled()
    gc.disable()
    try:
        worker.send({"kind": "reply", "op": "prepared"})
        go = worker.receive_command()
        if go is None or go.get("op") != "go":
            return None
        seeds = go.get("seeds", [])
        distributions = go.get("distributions") or ["x1"] * len(seeds)
        staged = [side.inputs_for(int(seed), str(d)) for seed, d in zip(seeds, distributions)]
        times = _calls(side, staged, device, flush, projector, reassert if name == "ref" else None, cover, kind)
        worker.send({"kind": "reply", "op": "timed", "times_ms": times})
    finally:
        if collecting:
            gc.enable()
    staged = None
    side.released.clear()
    return times


def _calls(side, staged, device, flush, projector, before_call, cover, kind: str) -> list:
    """A batch's timed calls on inputs drawn before the parent's clock started. After every call, before the next
    can touch its inputs (an output may legally be a view of them), its output is checked after a device-wide
    synchronise (work deferred past the call shows up here) and poisoned: nothing of the reference's answer is
    left for the candidate to find, and a candidate that hands back a tensor it keeps finds NaN in it next time.
    Both sides get the same host work after every call, or the side whose host has just done more launches its
    next call slower; it is harness code on the harness's tensors, with the collector off, so a submission has
    no hook in it to pad the reference's share of the parent's clock.

    Each output is freed before the next call, as in a caller's loop: with a batch's outputs kept alive until
    its end, every call wrote fresh memory (a CPU's page faults: 1.7x on a 1 MB ReLU) and a README example read
    0.57x against itself."""
    times, pending = [], []
    for seed, inputs in staged:
        elapsed, seed, placed, out, early = _timed_call(
            side, lambda seed=seed, inputs=inputs: (seed, inputs), device, flush, projector, before_call, cover, kind)
        del placed
        times.append(elapsed)
        side.calls.append({"seed": seed})
        pending.append((len(side.calls) - 1, out, early))
        mark = time.perf_counter_ns()
        _settle(pending, projector, side, device)
        mark = side.spent("settle", mark)
        poison(out, side.own_storages)
        side.spent("poison", mark)
        del out
    return times


def _lead(side, device) -> None:
    """One untimed call before a host-kind batch, on inputs of its own drawn before the batch's (it cannot see
    them): the host's caches then hold the forward's path, as in a caller's loop, not the harness's. A forward that
    waits on the device inside its call pays that path serially: on an H100 an untimed call before the timed one
    took a device-synchronising kernel from 1.88x to 2.05x in KernelBench's loop with the harness's steps."""
    seed = derive_seed(side.secret, side.name, "lead", len(side.calls))
    _, inputs = side.inputs_for(seed)
    threads, modes = guards.thread_count(), guards.mode_depths()
    with torch.set_grad_enabled(side.grad):
        out = side.model(*inputs)
        flat = flatten_outputs(out)
    synchronize(device)
    # counted as a timed call's are: a thread or a mode left behind here would otherwise go unseen
    side.threads_started = max(side.threads_started, guards.thread_count() - threads)
    side.modes_left.update(guards.modes_left_active(modes))
    poison(flat, side.own_storages)
    del out, flat, inputs


class HarnessChanged(RuntimeError):
    """The timing worker's own objects were changed from outside the harness (a frame walk from a forward)."""


def _check_sides(sides: dict, models: dict, signals=None) -> None:
    """Before every batch: the sides are the harness's as it built them. Their objects are locals of the batch loop,
    which the tamper snapshot of module globals does not see, and a forward that walks its frames can reach
    them: a reference swapped for a slower one, a method shadowed on the instance (a draw that waits), a batch
    store that rewrites what is committed. In-process, so it raises the bar rather than closing the way."""
    if set(sides) != {"ref", "cand"} or type(sides) is not dict:
        raise HarnessChanged("the timing sides were replaced")
    for name, side in sides.items():
        if type(side) is not Side or side.model is not models[name] or type(side.batch) is not dict:
            raise HarnessChanged(f"the {name} side's model, class or batch store was replaced")
        shadowed = [key for key in vars(side) if callable(getattr(Side, key, None))]
        if shadowed:
            raise HarnessChanged(f"the {name} side's {shadowed[0]} was replaced on the instance")
    if signals is not None and guards.signal_state() != signals:
        raise HarnessChanged(f"a signal handler or timer was set ({guards.signal_state()}; before the submission: "
                             f"{signals})")


def _check_harness(projector, flush) -> None:
    """Before every batch: the projector and the flush buffer, which both sides' calls use, are the harness's as
    it built them. A tensor subclass's __torch_function__ put in a projection plan ran inside the settling after
    every reference call, padding the reference's share of the parent's clock (a red team's 2.5x for a 1x
    matmul). In-process, so it raises the bar rather than closing the way."""
    if type(projector) is not Projector or type(projector.plans) is not dict:
        raise HarnessChanged("the output projector or its plans were replaced")
    if any(callable(getattr(Projector, key, None)) for key in vars(projector)):
        raise HarnessChanged("a method of the output projector was replaced on the instance")
    for plan in projector.plans.values():
        if type(plan) is not tuple or any(type(part) is not torch.Tensor for part in plan):
            raise HarnessChanged("an output projection plan was replaced")
    if flush is not None and type(flush) is not torch.Tensor:
        raise HarnessChanged("the cache flush buffer was replaced")


def commitment(entry: dict) -> str:
    """What a call's projections and output signature hash to (kbverify.timing_control checks a revealed call
    against it: the same function, there)."""
    from kbverify.timing_control import commitment as same

    return same(entry)


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
            side.released.clear()
        calls += 1
        if calls >= 50:
            break
    for side in sides.values():
        side.settle_gaps_ms.clear()
        side.host_ms.clear()
        side.phase_ns.clear()
        side.uncovered = 0
        side.previous_inputs = None


def _settle(pending: list, projector, side: Side, device) -> None:
    synchronize(device)
    for call_index, out, early in pending:
        flat = flatten_outputs(out)
        late = projector(flat)
        call = side.calls[call_index]
        call["signature"] = signature = output_signature(flat)
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


class SmClock:
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
