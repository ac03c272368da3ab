"""The chosen timed calls judged whole against the reference, in a process without submission code.

The candidate's timing worker copied every timed output at its end event and wrote the copies of the calls the
parent chose, after each batch, into the parent's folder (kbverify.timing.timing_control). Here each copy is read under
the reference's bound, allowing no code to run, and compared on the inputs its call drew (the parent's seed and
distribution) by the same comparison as the correctness sets (kbverify.worker.evaluate.judge_call). The record is
computed evidence; the parent applies the protocol's rule to it (kbverify.judge.timing).
"""

from __future__ import annotations

import io
import json
import os

import torch

from kbverify.core.inputs import derive_seed, timed_inputs
from kbverify.worker.evaluate import build_reference, judge_call, shape_namespaces
from kbverify.worker.handover_files import handover_limit, read_regular
from kbverify.worker.precision import set_tf32
from kbverify.worker.timing import _reference_signature
from kbverify.worker.timing_sides import digest
from kbverify.worker.worker import announce, device_from, short_error, task_from

# The evidence a checked call keeps: what kbverify.judge.correctness.judge_set reads.
KEPT = ("comparison", "baseline", "reference_vs_fp64", "exact_reference", "candidate_vs_fp64", "baseline_vs_fp64",
        "moved_vs_fp64", "candidate_output_error", "infrastructure_error", "valid", "invalid_reason")


def timing_check_job(payload: dict) -> dict:
    """Every chosen call: its copy against the reference on the call's own inputs (SPEC §4, stale outputs)."""
    device = device_from(payload)
    secret = payload["secret"]
    outdir = payload["outdir"]
    announce("reference:load")
    namespace = shape_namespaces(task_from(payload), [{"shape": "original", "overrides": {}}])["original"]
    set_tf32(matmul=bool(payload.get("baseline_matmul_tf32", True)),
             cudnn=bool(payload.get("baseline_cudnn_tf32", True)))
    reference, _ = build_reference(namespace, derive_seed(secret, "timing-weights"), "default", device,
                                   bool(payload.get("train_mode", True)))
    announce("timing:stale-check")
    signature = json.loads(json.dumps(_reference_signature(reference, namespace, device)))
    exact_flags = (bool(payload.get("reference_tf32", False)), bool(payload.get("reference_cudnn_tf32", False)))
    want_baseline = bool(payload.get("baseline_tf32", True)) and device.type == "cuda"
    want_fp64 = bool(payload.get("fp64_reference", True))
    calls = []
    for check in payload["checks"]:
        index = int(check["call"])
        entry: dict = {"call": index}
        if "file" not in check:  # no copy: the parent says whose fault that was
            entry.update({key: check[key] for key in ("missing", "infrastructure_error") if key in check})
        elif _kinds(check.get("signature")) != _kinds(signature):
            entry["wrong_structure"] = True
        else:
            inputs = timed_inputs(namespace, int(check["seed"]), str(check.get("distribution") or "x1"), device)
            path = os.path.join(outdir, os.path.basename(str(check["file"])))
            read = _Committed(path, device, check.get("digest"))
            call = lambda fp64: judge_call(  # noqa: E731
                reference, inputs, derive_seed(secret, "rng", index), device, exact_flags, want_baseline, fp64, read,
                derive_seed(secret, "nudge", "timed", index), phase=f"timing:check:{index}")
            # the float64 runs only where the fp32 comparison leaves the verdict open: most calls are within any
            # protocol's limits, and the exact answer would cost each of them another reference run or more
            judged = call(False)
            if want_fp64 and not _plainly_within(judged.get("comparison")):
                judged = call(True)
            entry.update({key: judged[key] for key in KEPT if key in judged})
            if read.uncommitted:
                entry["not_committed"] = True
        calls.append(entry)
    return {"checked": len(calls), "calls": calls}


class _Committed:
    """Reads a copy the candidate's process wrote, as a hand-over is read (a plain file under the reference's
    bound, loaded with no code run), and notes whether it is the copy whose digest came with the batch's times
    (`uncommitted`): one made or changed after the parent chose the call is not."""

    def __init__(self, path: str, device, committed):
        self.path, self.device, self.committed, self.uncommitted = path, device, committed, False

    def __call__(self, reference: list) -> list:
        data = read_regular(self.path, handover_limit(reference))
        try:
            copies = torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)
        except Exception as error:  # noqa: BLE001 - the file is the candidate process's: unreadable is its failure
            raise ValueError(f"the copy of the timed output is unreadable ({short_error(error)})") from None
        if type(copies) is not list or not all(c is None or type(c) is torch.Tensor for c in copies):
            raise ValueError("the copy of the timed output is not a list of tensors")
        self.uncommitted = digest(copies) != self.committed
        return copies


def _plainly_within(comparison: dict | None) -> bool:
    """Within 1e-4 element-wise and norm-wise against the fp32 reference, finite where it is: within the limits of
    every protocol (the strictest uses 1e-4), whatever the exact answer would add."""
    parts = (comparison or {}).get("outputs")
    if not parts:
        return False
    return all("grid" in part and not part["nonfinite_mismatch"] and part["grid"][repr(1e-4)]["max_ratio"] <= 1.0
               and part["norm_rel"] <= 1e-4 for part in parts)


def _kinds(signature) -> list | None:
    """Each output's type and dtype, without its shape: a shape may follow the call's own inputs (a masked
    select), and the comparison with the reference on those inputs judges it."""
    if not isinstance(signature, list):
        return None
    return [[item[0], item[2]] if isinstance(item, (list, tuple)) and len(item) == 3 else item for item in signature]
