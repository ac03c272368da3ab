"""Which clock a fast_p table is made from (`score`, `report`, `rescore --clock device|host`; SPEC §5).

Every verified verdict carries two clocks (kbverify.timing.timing_modes): the device-time speedup, behind the
device-side hold, and the host-inclusive speedup, what a caller waiting on each call sees. A table is made from
one named clock for every verdict, never from whichever one a verdict's mode chose for its headline, so a
candidate that makes its forward look blocked cannot move itself from one table to the other.

The default is `device`: it is the kernel's own speed, what `verified` has always reported (stored tables stay
comparable), the host's launch overhead belongs to the caller's machine (the same kernels read 2.37x on one host
and 3.02x on another), and a blocked side's device time is capped at its own host-inclusive time, so a blocked
forward is never credited with more than it can have. `host` answers "how much faster is my model's call".

Verdicts recorded before the host clock was kept, or under a protocol that times another way (`original`,
`kbv`), have no such entry: they keep their own speedup, and `missing_clock` counts them so the output can say so.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from kbverify.core.records import Verdict
from kbverify.core.stats import positive

CLOCKS = ("device", "host")
DEFAULT_CLOCK = "device"


def clock_entry(verdict: Verdict, clock: str) -> dict | None:
    """The verdict's own entry for `clock`, or None when it has none (an older record, another timing)."""
    timing = verdict.timing or {}
    if "mode" not in timing:  # before the two kinds of batch: its "host" was the parent's wall clock
        return None
    entry = (timing.get("clocks") or {}).get(clock)
    if not isinstance(entry, dict) or not _positive(entry.get("speedup")):
        return None
    return entry


def clock_view(verdict: Verdict, clock: str) -> Verdict:
    """The verdict with its speedup, CI and times read from `clock`; as it is when it has no entry for it."""
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}: one of {', '.join(CLOCKS)}")
    entry = clock_entry(verdict, clock)
    if entry is None or verdict.speedup is None:
        return verdict
    ci = entry.get("ci") or [None, None]
    return dataclasses.replace(verdict, speedup=float(entry["speedup"]),
                               speedup_ci=(ci[0], ci[1]) if all(_positive(c) for c in ci) else verdict.speedup_ci,
                               ref_time_ms=entry.get("ref_ms", verdict.ref_time_ms),
                               cand_time_ms=entry.get("cand_ms", verdict.cand_time_ms))


def views(verdicts: Sequence[Verdict], clock: str) -> tuple[list[Verdict], int]:
    """Every verdict read from `clock`, and how many timed the interleaved way had no entry for it (kept as they
    were). Verdicts of a protocol that times another way (`original`'s mean of trials) are not counted."""
    out, missing = [], 0
    for verdict in verdicts:
        interleaved = "interleaved" in (verdict.timing or {})
        if verdict.speedup is not None and interleaved and clock_entry(verdict, clock) is None:
            missing += 1
        out.append(clock_view(verdict, clock))
    return out, missing


def missing_note(clock: str, missing: int) -> str:
    if not missing:
        return ""
    return (f"clock: {clock}; {missing} timed verdict(s) carry no {clock} clock (recorded before both clocks were "
            "kept, or timed another way): their own speedup is used")


def _positive(value) -> bool:
    """`stats.positive`, and never a bool: a clock entry is JSON the timing worker wrote, where `true` is not 1."""
    return not isinstance(value, bool) and positive(value)
