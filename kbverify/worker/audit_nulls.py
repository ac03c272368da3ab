"""The audit child's null kernels (zeros, ones, the input itself, another seed's output or its mean, the reference
in bf16 or fp16), each dropped as soon as every protocol that could still accept it has rejected it."""

from __future__ import annotations

import copy

import torch

from kbverify.audit.protocols import covers
from kbverify.judge.correctness import certainly_rejects, judge_set, screen, summarize
from kbverify.worker.audit_family import _LOW_PRECISION, _copy_tf32, _FamilyContext, _stop_if_out_of_memory, _tf32_summary
from kbverify.worker.audit_tensors import _mean
from kbverify.worker.worker import announce, is_cuda_fatal, short_error


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
