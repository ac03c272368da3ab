"""The timed outputs the parent chose to check, against the reference, in a process without submission code.

The candidate's timing worker committed to each call's output projections (kbverify.child.timing) before it knew
which calls the parent would check; the parent hands the revealed ones here with the seed and the distribution
it chose for each call, so each is compared with the reference on exactly the inputs the timed call drew.
"""

from __future__ import annotations

import json

import torch

from kbverify.child import timing
from kbverify.child.evaluate import build_reference, shape_namespaces
from kbverify.child.precision import assert_baseline_flags, set_tf32, tf32_state
from kbverify.child.timing import _reference_signature
from kbverify.child.timing_sides import Projector
from kbverify.child.worker import announce, device_from, set_seed, task_from
from kbverify.child.exact import FP64_INPUT_BYTES_LIMIT
from kbverify.allowances import ROUNDING_ALLOWANCE
from kbverify.correctness import flatten_outputs
from kbverify.inputs import clone_inputs, derive_seed, timed_inputs


def timing_check_job(payload: dict) -> dict:
    """The checked timed calls against the reference, in a process without submission code: the candidate's
    worker committed to each call's output projections before it knew which calls the parent would check, and
    the parent hands the revealed ones here with the seeds it chose (SPEC §4, stale outputs)."""
    device = device_from(payload)
    secret = payload["secret"]
    announce("reference:load")
    namespace = shape_namespaces(task_from(payload), [{"shape": "original", "overrides": {}}])["original"]
    set_tf32(matmul=bool(payload.get("baseline_matmul_tf32", True)),
             cudnn=bool(payload.get("baseline_cudnn_tf32", True)))
    flags = tf32_state()
    reference, _ = build_reference(namespace, derive_seed(secret, "timing-weights"), "default", device,
                                   bool(payload.get("train_mode", True)))
    announce("timing:stale-check")
    wide = _float64_copy(reference)
    projector = Projector(secret, device)
    reassert = lambda: assert_baseline_flags(flags)  # noqa: E731
    signature = json.loads(json.dumps(_reference_signature(reference, namespace, device)))
    norm_rtol, allowance = float(payload.get("norm_rtol") or 1e-3), float(payload.get("baseline_allowance") or 0.0)
    mismatches, wrong_structure = [], []
    for check in payload["checks"]:
        index = int(check["call"])
        if check.get("signature") != signature:
            wrong_structure.append(index)
            continue
        try:  # the parent checked the form; what is in it is still the candidate's
            kept = [None if p is None else _from_raw(p) for p in check["projections"]]
        except (TypeError, ValueError) as error:
            mismatches.append({"call": index, "relative_error": None, "why": f"unreadable projections ({error})"})
            continue
        # the call's own draw: its seed and the distribution the parent chose for it, as the timed call drew it
        inputs = timed_inputs(namespace, int(check["seed"]), str(check.get("distribution") or "x1"), device)
        exact, baseline = _reference_projections(reference, inputs, secret, index, projector, reassert)
        mismatch = _compare_projections(index, kept, exact, baseline, norm_rtol, allowance)
        if mismatch is not None and mismatch.get("relative_error") is not None and wide is not None:
            # the verified rule is stated on the exact answer: judged again against float64 (kbverify.correctness)
            truth = _float64_projections(wide, inputs, secret, index, projector)
            if truth is not None and _within_float64_rule(kept, exact, baseline, truth, norm_rtol, allowance):
                mismatch = None
        if mismatch is not None:
            mismatches.append(mismatch)
    return {"checked": len(payload["checks"]), "mismatches": mismatches, "n_mismatches": len(mismatches),
            "wrong_structure": wrong_structure[:10], "n_wrong_structure": len(wrong_structure)}


def _from_raw(text: str) -> torch.Tensor:
    import base64

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.float64)


def _compare_projections(index, kept, exact, baseline, norm_rtol: float, allowance: float) -> dict | None:
    """A kept timed output against the reference on the same inputs, under the correctness rule's norm-wise
    limit (with the TF32 baseline's own error as allowance): a timed path that differs from the judged one,
    replays, or leaves work undone fails here."""
    if len(kept) != len(exact):
        return {"call": index, "relative_error": None, "why": "another number of outputs"}
    for got, want, base in zip(kept, exact, baseline):
        if got is None and want is None:  # neither has elements to compare (a zero-size output, say)
            continue
        if got is None or want is None or got.shape != want.shape:
            return {"call": index, "relative_error": None, "why": "no tensor output"}
        error = _sample_norm_error(got, want)
        base_error = _sample_norm_error(base, want) if base is not None else 0.0
        limit = timing.STALE_SAMPLING_FACTOR * max(norm_rtol, allowance * base_error)
        gross = _projection_error(got, want)
        if not (error <= limit and gross <= 3 * limit):
            return {"call": index, "relative_error": error, "projection_error": gross, "limit": limit}
    return None


def _float64_copy(reference):
    """The reference model in float64 (the exact answer the verified rule is stated on); None where it has none."""
    import copy

    try:
        return copy.deepcopy(reference).double()
    except Exception:  # noqa: BLE001 - a model without a float64 path: the fp32 rule alone, as in the judge
        return None


def _float64_projections(wide, inputs, secret, index, projector) -> list | None:
    size = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    if size > FP64_INPUT_BYTES_LIMIT:
        return None
    wide_inputs = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in clone_inputs(inputs)]
    set_seed(derive_seed(secret, "rng", index))
    try:
        with torch.no_grad():
            return [None if v is None else v.cpu() for v in projector(flatten_outputs(wide(*wide_inputs)))]
    except Exception:  # noqa: BLE001 - the reference's own float64 run: its failure is no verdict on the kernel
        return None


def _within_float64_rule(kept, exact, baseline, truth, norm_rtol: float, allowance: float) -> bool:
    """Every output within the norm-wise limit against float64, with the fp32 reference's own error against
    float64 ×ROUNDING_ALLOWANCE and the TF32 baseline's ×allowance as allowances: a timed output closer to the
    exact answer than the fp32 reference (a reduction that cancels on shifted inputs) is never wrong for it."""
    for got, want, base, true in zip(kept, exact, baseline, truth):
        if got is None and want is None:
            continue
        if got is None or true is None or got.shape != true.shape:
            return False
        reference_error = _sample_norm_error(want, true)
        base_error = _sample_norm_error(base, true) if base is not None else 0.0
        limit = timing.STALE_SAMPLING_FACTOR * max(norm_rtol, ROUNDING_ALLOWANCE * reference_error,
                                                   allowance * base_error)
        if not (_sample_norm_error(got, true) <= limit and _projection_error(got, true) <= 3 * limit):
            return False
    return True


def _reference_projections(reference, inputs, secret, index, projector, reassert):
    reassert()
    flags = tf32_state()
    set_tf32(matmul=False, cudnn=False)
    set_seed(derive_seed(secret, "rng", index))
    with torch.no_grad():
        exact = [None if v is None else v.cpu() for v in projector(flatten_outputs(reference(*clone_inputs(inputs))))]
    assert_baseline_flags(flags)
    set_seed(derive_seed(secret, "rng", index))
    with torch.no_grad():
        baseline = [None if v is None else v.cpu() for v in projector(flatten_outputs(reference(*inputs)))]
    return exact, baseline


def _sample_norm_error(got, want) -> float:
    count = Projector.COUNT
    got_sample, want_sample = got[count + 1:], want[count + 1:]
    norm = float(torch.linalg.vector_norm(want_sample))
    diff = float(torch.linalg.vector_norm(got_sample - want_sample))
    if not torch.isfinite(got_sample).all():
        return float("inf")
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def _projection_error(got, want) -> float:
    count = Projector.COUNT
    error = float(torch.sqrt(((got[:count] - want[:count]) ** 2).mean()))
    return error / max(float(want[count]), 1e-30)
