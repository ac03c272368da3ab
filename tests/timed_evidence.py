"""Records of the timed-output check (kbverify.worker.timing_check) made from real comparisons, for the judge's
table tests: each call's evidence is `kbverify.judge.correctness.summarize` of a reference tensor against a candidate a
given norm-wise error away, as the checking worker writes it."""

from __future__ import annotations

import functools

import torch

from kbverify.judge.correctness import summarize

ELEMENTS = 4096


@functools.lru_cache(maxsize=None)
def _reference() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(ELEMENTS, generator=generator)


@functools.lru_cache(maxsize=None)
def comparison(error: float) -> dict:
    """A candidate whose norm-wise error against the reference is `error` (inf: NaN everywhere), spread evenly."""
    reference = _reference()
    if error == float("inf"):
        candidate = torch.full_like(reference, float("nan"))
    else:
        candidate = reference * (1.0 + error)
    return summarize(reference, candidate)


def call(index: int, error: float = 0.0) -> dict:
    """One checked call's evidence as timing_check writes it (a CPU run: no TF32 baseline, no float64 run)."""
    return {"call": index, "valid": True, "comparison": comparison(error),
            "exact_reference": "unavailable (the protocol asks for no float64 run)"}


def stale(errors: list[float], checked: int = 28) -> dict:
    """A check of `checked` calls, the first len(errors) of them off by those errors, the rest exact."""
    calls = [call(i, e) for i, e in enumerate(errors)]
    calls += [call(i) for i in range(len(errors), checked)]
    return {"checked": len(calls), "calls": calls}
