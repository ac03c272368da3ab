"""Timing in the worker: raw samples only; every statistic is recomputed by the parent (SPEC §5).

Interleaved method: rounds in which the reference and the candidate each make a few calls, in a random order per
round. Every call gets a new input draw made outside the timed pair (sometimes copied into the previous call's
tensors, which defeats pointer-keyed caches), the L2 is flushed before it, and the CUDA events sit stream-ordered
right around it. Guards ride along: a copy of each output taken stream-ordered right after the call, compared with
the output after a device-wide synchronise and, for the calls the parent chooses after each batch, judged whole in a
process without submission code; a second end event after that synchronise; thread counts; the baseline's flags and
torch functions re-checked before every reference call.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from kbverify.core.inputs import derive_seed, draw_inputs
from kbverify.core.status import Warn
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker import guards
from kbverify.worker.evaluate import build_reference, construct_candidate, in_protocol_mode, shape_namespaces
from kbverify.worker.extensions import ExtensionWatch
from kbverify.worker.precision import assert_baseline_flags, set_tf32, tf32_state
from kbverify.worker.timed_call import _SLEEP, Cover, flush_buffer
from kbverify.worker.timing_record import finish_record
from kbverify.worker.timing_rounds import HarnessChanged, SmClock, _serve_batches, _warm_up
from kbverify.worker.timing_sides import make_sides, output_signature
from kbverify.worker.worker import announce, compile_untrusted, device_from, set_seed, short_error, task_from

CALLS_PER_SIDE = 3


@dataclass(frozen=True)
class BeforeSubmission:
    """What the worker captured after loading the task and before any submission code ran: the baseline's flags,
    the tamper snapshot, torch's namespace and the mode stacks, compared with what is there at the end."""

    flags: dict
    sensitive: dict
    torch_functions: dict
    modes: object

    @classmethod
    def capture(cls) -> "BeforeSubmission":
        return cls(flags=tf32_state(), sensitive=guards.snapshot_sensitive(),
                   torch_functions=guards.snapshot_torch_namespace(), modes=guards.mode_depths())


def timing_job(payload: dict) -> dict:
    """The rounds of the sides this worker serves (`payload["sides"]`): the candidate's in its worker, the
    reference's in a worker that never runs submission code (`reference_timing_job`). The candidate's worker still
    builds the reference: its weights are the candidate's, its outputs the signature."""
    device = device_from(payload)
    task = task_from(payload)
    secret = payload["secret"]
    train = bool(payload.get("train_mode", True))
    aa = bool(payload.get("aa", False))
    serves = tuple(side for side in ("ref", "cand") if side in (payload.get("sides") or ("ref", "cand")))
    record: dict = {"warnings": [], "sides": list(serves)}

    announce("reference:load")
    namespace = shape_namespaces(task, [{"shape": "original", "overrides": {}}])["original"]
    set_tf32(matmul=bool(payload.get("baseline_matmul_tf32", True)),
             cudnn=bool(payload.get("baseline_cudnn_tf32", True)))
    before = BeforeSubmission.capture()
    weight_seed = derive_seed(secret, "timing-weights")
    reference, _ = build_reference(namespace, weight_seed, "default", device, train)

    candidate, watch = None, None
    if "cand" in serves and aa:
        candidate = build_reference(namespace, weight_seed, "default", device, train)[0]
    elif "cand" in serves:
        announce("candidate:load")
        watch = ExtensionWatch().install()
        # A second execution of the task: the submission must not reach the reference's class or globals.
        own_task = shape_namespaces(task, [{"shape": "original", "overrides": {}}])["original"]
        try:
            candidate = _load_candidate(payload["submission_source"], own_task, reference, weight_seed, device, train)
        except BaseException as error:  # noqa: BLE001
            return {**record, "load_error": short_error(error)}
    record["flags_changed_at_import"] = {key: value for key, value in tf32_state().items()
                                         if before.flags.get(key) != value}
    record["torch_functions_changed"] = guards.torch_namespace_changes(before.torch_functions)

    sides = make_sides(reference if "ref" in serves else None, candidate, namespace, device, secret, payload)
    flush = flush_buffer(device)
    cover = _device_hold(device, record["warnings"])
    reassert, flag_changes = _reasserter(before.flags)
    _measure(record, payload, sides, device, flush, reassert, cover, reference, namespace,
             timers=before.sensitive.get("state:timers"))
    return finish_record(record, sides, cover, before, flag_changes, watch, reference, namespace, device)


def _load_candidate(source: str, own_task: dict, reference, weight_seed: int, device, train: bool):
    """The submission executed in its own copy of the task's names, and its ModelNew built from the reference's
    weights (kbverify.worker.construct), in the protocol's mode."""
    cand_namespace = {k: v for k, v in own_task.items() if not k.startswith("__")}
    cand_namespace["__name__"] = "kbverify_submission"
    exec(compile_untrusted(source), cand_namespace)
    set_seed(weight_seed)

    def reseed() -> list:
        set_seed(weight_seed)
        return own_task["get_init_inputs"]()

    built = construct_candidate(cand_namespace["ModelNew"], own_task["get_init_inputs"](),
                                reference.state_dict(), reseed=reseed)[0]
    return in_protocol_mode(built.to(device), train)


def _device_hold(device, warnings: list):
    # torch.cuda._sleep is private API: without it the launch race is back, and the record says so
    cover = Cover(device) if device.type == "cuda" and _SLEEP is not None else None
    if device.type == "cuda" and cover is None:
        warnings.append(Warn.NO_DEVICE_HOLD.value)
    return cover


def _reasserter(flags: dict):
    """The check run before every reference call: the baseline's flags are as they were set, and the first few
    changes found are kept for the record."""
    flag_changes: list[dict] = []

    def reassert():
        now = tf32_state()
        if now != flags and len(flag_changes) < 5:
            flag_changes.append({key: value for key, value in now.items() if flags.get(key) != value})
        assert_baseline_flags(flags)

    return reassert, flag_changes


def _measure(record: dict, payload: dict, sides: dict, device, flush, reassert, cover, reference,
             namespace: dict, timers=None) -> None:
    """The warm-up, then the parent's rounds; a failure is recorded with the side whose phase it happened in."""
    try:
        _await_turn()
        announce("timing:warmup")
        _warm_up(sides, device, flush, reassert, cover, seconds=float(payload.get("warmup_s", 0.2)))
        if cover is not None:
            cover.settle()
        # Everything built so far (torch, the models, the warm-up's objects) out of the collector's reach: a full
        # collection over it between calls stalls the host for milliseconds, both sides alike, but the rounds are
        # what the time budget buys.
        sm_clock = SmClock(device)
        # the warm-up ran each side's first calls (a JIT's compile, a library's first launch): handlers installed
        # by then are the machinery's; one installed during the rounds is tamper (guards.signal_handlers)
        signals = (guards.signal_handlers(), timers) if timers is not None else None
        gc.collect()
        gc.freeze()
        announce("timing:rounds")
        record["timing_s"] = _serve_batches(sides, device, flush, reassert, cover, sm_clock, payload.get("outdir"),
                                             lead_call=bool(payload.get("host_lead_call", True)), signals=signals)
        if signals is not None and guards.signal_handlers() != signals[0]:
            raise HarnessChanged(f"a signal handler was set during the timed rounds ({guards.signal_handlers()}; "
                                 f"after the warm-up: {signals[0]})")
        record["signature"] = _reference_signature(reference, namespace, device)
    except BaseException as error:  # noqa: BLE001 - who raised decides whose failure it is
        record["error"] = short_error(error)
        record["error_side"] = "reference" if _last_phase_is_reference() else "candidate"


def _await_turn() -> None:
    """Loaded, wait for the parent's word to warm up: the workers of one timing warm up one after the other, so
    neither's warm-up (and the hold probe it measures) runs beside the other's (kbverify.timing.timing_control.drive)."""
    from kbverify.worker import worker

    worker.send({"kind": "reply", "op": "loaded"})
    command = worker.receive_command()
    if command is None or command.get("op") != "warm":
        raise HarnessChanged("the parent's word to warm up never came")


def _reference_signature(reference, namespace, device) -> list:
    with torch.no_grad():
        return output_signature(flatten_outputs(reference(*draw_inputs(namespace, 0, device))))


def _last_phase_is_reference() -> bool:
    from kbverify.worker import worker

    phase = worker.last_phase()
    return bool(phase) and not phase.startswith("candidate")


def reference_timing_job(payload: dict) -> dict:
    """The reference alone, in a process that never runs submission code: the reference's side of a verified
    timing, or (`aa`) one of two copies of it timed against each other (the noise margin). The parent drives its
    rounds (kbverify.timing.timing_control) and keeps their times."""
    return timing_job({**payload, "submission_source": "", "aa": True})  # a candidate side is a reference copy
