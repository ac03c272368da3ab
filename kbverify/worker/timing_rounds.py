"""The timing worker's warm-up and its service of the parent's rounds (kbverify.timing.timing_control), batch by batch.

`_serve_batches`, `_calls` and `_warm_up` keep their names: they are the frames above every timed forward, and the adversarial
submissions of the tests (tests/corpus, tests/test_hang.py) find them by name.
"""

from __future__ import annotations

import gc
import time

import torch

from kbverify.core.inputs import derive_seed, draw_inputs
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker import guards
from kbverify.worker.timed_call import KINDS, _timed_call
from kbverify.worker.timing_sides import Side, changed_since, digest, output_signature, poison
from kbverify.worker.worker import announce, synchronize

def _serve_batches(sides, device, flush, reassert, cover, sm_clock, outdir: str | None = None, *,
                   lead_call: bool = True, signals=None) -> float:
    """The parent's rounds (kbverify.timing.timing_control), one side's batch at a time: it names the side, then starts
    its clock and sends each call's input seed, and reads the times back at once, bounded by that clock. A copy of
    each candidate output is kept until the parent, after the batch, names the calls it checks; those copies go
    whole to `outdir` for a process without submission code to judge. `signals`: (the signal handlers after the
    warm-up, the timers before the submission loaded), as guards.signal_handlers and guards.timer_state read
    them. Returns the seconds spent serving."""
    from kbverify.worker import worker

    worker.send({"kind": "reply", "op": "ready"})
    models = {name: side.model for name, side in sides.items()}  # the sides it serves, as built
    started = time.monotonic()
    threads = guards.python_thread_count()  # after the warm-up: a compiler's worker threads are there by now
    while True:
        command = worker.receive_command()
        if command is None or command.get("op") == "end":
            return time.monotonic() - started
        if command.get("op") == "reveal":  # the last batch's calls, at the end of the rounds
            worker.send({"kind": "reply", "op": "reveal", "calls": _revealed(sides.get("cand"), command, outdir)})
        elif command.get("op") == "batch":
            name = "ref" if command.get("side") == "ref" else "cand"
            if name not in models:  # a side served by another worker: the parent never asks for it
                raise HarnessChanged(f"asked for the {name} side's batch, which another worker serves")
            sides[name].batch = {}
            _check_sides(sides, models, signals)
            _check_harness(flush)
            if guards.python_thread_count() > threads:
                # A thread that outlives the call that started it can run inside the reference's batch: one holding
                # the GIL there padded the reference's share of the parent's clock (corpus:
                # matmul_shrinks_times_pads_reference_harness_by_gil_thread)
                raise HarnessChanged(f"Python threads were started during the timed rounds "
                                     f"({guards.python_thread_count()} running, {threads} after the warm-up)")
            kind = command.get("kind") if command.get("kind") in KINDS else "device"
            checked = outdir if name == "cand" and command.get("check") else None
            times = _batch(sides[name], name, kind, device, flush, reassert, cover, lead_call, checked)
            if times is None:
                return time.monotonic() - started
            side = sides[name]
            worker.send({"kind": "reply", "op": "batch", "side": name, "batch_kind": kind, "times_ms": times,
                         "first_call": len(side.calls) - len(times), "sm_clock_mhz": sm_clock()})


def _revealed(side, command: dict, outdir: str | None) -> dict:
    calls = [i for i in command.get("calls", []) if isinstance(i, int) and not isinstance(i, bool)]
    if outdir is None or side is None:
        return {str(i): {"infrastructure_error": "the worker was given no hand-over folder"} for i in calls}
    return side.reveal(calls, outdir)


def _batch(side, name: str, kind: str, device, flush, reassert, cover, lead_call: bool,
           outdir: str | None = None) -> list | None:
    """One side's batch: its calls' times, or None if the parent's `go` (or its choice of checked calls) never came.

    The seeds come with `go`, after the parent's clock has started: no code of the candidate's that runs before
    it (a lead call's forward, a finalizer freed with the last batch's store) can know the inputs and compute
    the outputs off the clock (corpus: matmul_precomputes_outputs_before_go_by_batch_store_finalizer). The
    draws are then harness work on the clock, the same for both sides. The collector stays off from before the
    clock starts until after it stops (corpus: matmul_shrinks_times_pads_reference_harness_by_gc_callback), and nothing that
    existed before the batch is freed inside it (the previous inputs go after `timed`): a finalizer on a
    reference tensor freed there would pad its share of the clock (corpus:
    matmul_shrinks_times_pads_reference_harness_by_input_finalizer). With `outdir` (a candidate batch the
    parent checks), the parent names the calls it checks after `timed`, and their copies are written before
    the collector runs again or anything of the batch is freed: no finalizer of the candidate's runs between
    the copy and the hand-over."""
    from kbverify.worker import worker

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
        times = _calls(side, staged, device, flush, reassert if name == "ref" else None, cover, kind)
        # the digests are made on the parent's clock, between `settled` and `timed`: the parent keeps that phase
        # out of the timing budget (it buys no precision), and inside the batch's wall
        worker.send({"kind": "reply", "op": "settled"})
        for index in range(len(side.calls) - len(times), len(side.calls)):
            call = side.calls[index]
            call["digest"] = digest(call.pop("copies", []))  # both sides: the same harness work on the clock
        # the candidate's digests leave with the times, on the parent's clock, before it chooses
        digests = {str(i): side.calls[i]["digest"] for i in range(len(side.calls) - len(times), len(side.calls))
                   } if name == "cand" else {}
        worker.send({"kind": "reply", "op": "timed", "times_ms": times, "digests": digests})
        if outdir is not None:
            chosen = worker.receive_command()
            if chosen is None or chosen.get("op") != "reveal":
                return None
            worker.send({"kind": "reply", "op": "reveal", "calls": _revealed(side, chosen, outdir)})
    finally:
        if collecting:
            gc.enable()
    staged = None
    side.released.clear()
    return times


def _calls(side, staged, device, flush, before_call, cover, kind: str) -> list:
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
            side, lambda seed=seed, inputs=inputs: (seed, inputs), device, flush, before_call, cover, kind)
        del placed
        times.append(elapsed)
        side.calls.append({"seed": seed})
        pending.append((len(side.calls) - 1, out, early))
        mark = time.perf_counter_ns()
        _settle(pending, side, device)
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
    store that rewrites what is kept. In-process, so it raises the bar rather than closing the way."""
    if set(sides) != set(models) or type(sides) is not dict:
        raise HarnessChanged("the timing sides were replaced")
    for name, side in sides.items():
        if type(side) is not Side or side.model is not models[name] or type(side.batch) is not dict:
            raise HarnessChanged(f"the {name} side's model, class or batch store was replaced")
        shadowed = [key for key in vars(side) if callable(getattr(Side, key, None))]
        if shadowed:
            raise HarnessChanged(f"the {name} side's {shadowed[0]} was replaced on the instance")
    if signals is not None:
        handlers, timers = signals
        if guards.timer_state() != timers:
            raise HarnessChanged(f"a timer was set ({guards.timer_state()}; before the submission: {timers})")
        if guards.signal_handlers() != handlers:
            raise HarnessChanged(f"a signal handler was set during the timed rounds ({guards.signal_handlers()}; "
                                 f"after the warm-up: {handlers})")


def _check_harness(flush) -> None:
    """Before every batch: the flush buffer, which both sides' calls use, is the harness's as it built it: a
    tensor subclass's __torch_function__ put there would run inside the reference's calls, padding its share of
    the parent's clock. In-process, so it raises the bar rather than closing the way."""
    if flush is not None and type(flush) is not torch.Tensor:
        raise HarnessChanged("the cache flush buffer was replaced")


def _warm_up(sides, device, flush, reassert, cover, *, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    calls = 0
    while calls < (4 if cover is not None else 3) or time.monotonic() < deadline:
        if cover is not None:  # long and short holds in turn, the same for both sides (kbverify.timing.timing_modes)
            cover.probe_ms = cover.CAP_MS if calls % 2 == 0 else cover.PROBE_SHORT_MS
        for name, side in sides.items():
            announce("timing:reference-warmup" if name == "ref" else "candidate:warmup")
            seed = derive_seed(side.secret, name, "warmup", calls)
            early = _timed_call(side, lambda side=side, seed=seed: (seed, draw_inputs(side.namespace, seed, device)),
                                device, flush, reassert if name == "ref" else None, cover)[4]
            side.released.clear()
            # as a batch does: the copies digested, so the digest's own allocations are cached before the rounds
            digest(early)
        calls += 1
        if calls >= 50:
            break
    for side in sides.values():
        side.settle_gaps_ms.clear()
        side.host_ms.clear()
        side.phase_ns.clear()
        side.uncovered = 0
        side.previous_inputs = None


def _settle(pending: list, side: Side, device) -> None:
    """After a device-wide synchronise: each output against its copy made at the end event (a difference is work
    that outlived the call), and the copy kept for the parent's choice of checked calls."""
    synchronize(device)
    for call_index, out, early in pending:
        flat = flatten_outputs(out)
        call = side.calls[call_index]
        call["signature"] = signature = output_signature(flat)
        if changed_since(early, flat):
            call["unsettled"] = True
        call["copies"] = early  # digested by the batch once it has said it settled
        # both sides keep their copies until the batch ends: the same harness work on the clock in the
        # reference's worker as in the candidate's, whose copies the parent may choose to check
        side.keep(call_index, early, signature)
    pending.clear()


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
