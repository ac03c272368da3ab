"""Which way a kernel is timed, and its two clocks, decided by the parent from raw evidence alone (SPEC §5).

Every round of interleaved timing has batches of two kinds (kbverify.timing.timing_control): `device`, behind the
device-side hold that hides the host's launch overhead (nvbench's blocking kernel), and `host`, without it, each
call synchronised and the L2 flushed (nvbench's sync mode, KernelBench's events): what a caller that waits on
each call sees. So every verified verdict carries both clocks.

A forward that synchronises inside (`cudaDeviceSynchronize` in an extension, `.item()`, a host copy) waits out
the hold, so its "device time" holds the host's wake-up and the launches after it: on the H200 a GEMM epilogue
whose whole call took 0.074 ms read 0.446 ms behind the hold. Such a side is *blocked*, by either of two pieces
of evidence:

- the hold probe: warm-up calls behind long and short holds in turn; a forward whose host time follows the hold's
  length (it grows by most of the hold's growth, and each call outlasts its hold) waits on the device;
- the clocks: its device-kind time above its own host-kind time, which no real device time can be.

When either side is blocked, the verdict's speedup is the host clock (`mode: sync`), both sides timed the same way
without the hold; otherwise the device clock (`mode: hold`). The reference's evidence also comes from the clean
process (no submission code): a reference that blocks there blocks.

**Why claiming "blocked" gains a candidate nothing.** Every piece of evidence from the candidate's process is the
candidate's to forge, so the rule is made so that forging it cannot pay:

1. The host clock is measured in every round whether or not anything blocks, the same way for both sides and
   bounded by the parent's own clock like the device clock; the claim does not change how it is measured.
2. The device clock reported never holds a side's device time above its own host-kind time: the side's device
   samples are scaled down to that median (`stats.cap_side_medians`). A side's real device time is at most its
   host-inclusive time, so the cap never goes below the truth: a candidate that inflates its own device times
   (to look blocked) is left with its host-kind time, never less than its honest device time, and its
   device-clock speedup can only fall. A reference slowed beside the candidate to look blocked is capped at
   its host-kind time, which is above its true device time: as in the hold mode, the clean process's reference
   (timed where no submission code ran) bounds it (kbverify.judge.timing._against_clean_reference).
3. The fast_p tables are made from a named clock (`--clock device|host`), never from whichever the mode picked;
   the mode only chooses the verdict's headline, and a table of either clock reads the same numbers however the
   mode was chosen. So `score --clock device` of a candidate that fakes blocking is its capped device clock (1),
   and `--clock host` is its host clock (2): both what it would get without the claim, or less.

`tests/test_timing_modes.py` holds each of these to a case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kbverify.core import stats
from kbverify.timing import timing_control

# The hold probe: a blocked forward's host time grows by most of the hold's growth between the short and the long
# hold; host work that is merely long does not grow with the hold at all.
PROBE_TRACKING = 0.8
PROBE_OUTLASTS = 0.9  # and each call outlasts (nearly) the hold it had
# The clocks: a device-kind median this far above the same side's host-kind median is not a device time.
OVER_HOST_FRACTION = 0.05
OVER_HOST_MS = 0.002
MODES = ("hold", "sync", "cpu")

REQUESTS = ("auto", "hold", "sync")


@dataclass(frozen=True)
class ModeChoice:
    mode: str  # "hold" (device clock), "sync" (host clock), "cpu" (one clock: no hold exists on a CPU)
    reason: str
    blocked: tuple = ()  # which evidence said blocked: "cand:probe", "ref:clock", "clean_ref:probe", ...
    evidence: dict = field(default_factory=dict)

    @property
    def headline_kind(self) -> str:
        return "host" if self.mode == "sync" else "device"


def probe_blocked(pairs) -> bool | None:
    """Whether one side's warm-up calls ([hold ms, host ms] each) wait on the device; None when the probe has no
    long and short holds to compare. The side's first call (one-time costs) is left out."""
    usable = [(float(h), float(t)) for h, t in (pairs or [])[1:] if _number(h) and _number(t)]
    holds = sorted({h for h, _ in usable})
    if len(holds) < 2 or holds[-1] <= holds[0]:
        return None
    short, long = holds[0], holds[-1]
    at_short = stats.median([t for h, t in usable if h == short])
    at_long = stats.median([t for h, t in usable if h == long])
    return at_short >= PROBE_OUTLASTS * short and at_long - at_short >= PROBE_TRACKING * (long - short)


def clock_blocked(rounds: list, side: str) -> bool | None:
    """Whether one side's device-kind time is above its own host-kind time; None without both kinds."""
    device = stats.median([t for r in rounds for t in r.get(timing_control.side_key(side, "device")) or ()])
    host = stats.median([t for r in rounds for t in r.get(timing_control.side_key(side, "host")) or ()])
    if math.isnan(device) or math.isnan(host):
        return None
    return device > host * (1 + OVER_HOST_FRACTION) + OVER_HOST_MS


def has_host_clock(rounds: list) -> bool:
    return bool(timing_control.paired_rounds(rounds, "host"))


def decide_mode(record: dict, clean: dict | None, on_gpu: bool, requested: str = "auto") -> ModeChoice:
    """The timing mode from the stored record alone (so `rejudge` reaches the same one)."""
    rounds = record.get("rounds") or []
    if not on_gpu and requested == "auto":
        return ModeChoice("cpu", "a CPU has no device-side hold: one clock times the call")
    if not has_host_clock(rounds):
        return ModeChoice("hold", "recorded before the host clock was kept: device clock only")
    evidence: dict = {}
    for side in ("ref", "cand"):
        evidence[f"{side}:probe"] = probe_blocked((record.get("hold_probe") or {}).get(side))
        evidence[f"{side}:clock"] = clock_blocked(rounds, side)
    if clean:
        clean_rounds = clean.get("rounds") or []
        probes = clean.get("hold_probe") or {}
        # both of the clean process's sides are copies of the reference
        evidence["clean_ref:probe"] = any(probe_blocked(probes.get(s)) for s in ("ref", "cand"))
        evidence["clean_ref:clock"] = any(clock_blocked(clean_rounds, s) for s in ("ref", "cand"))
    blocked = tuple(name for name, said in evidence.items() if said)
    if requested in ("hold", "sync"):
        return ModeChoice(requested, f"{requested} mode was asked for", blocked, evidence)
    if blocked:
        return ModeChoice("sync", "a forward waits on the device inside its call (" + ", ".join(blocked) + "): "
                          "both sides are timed without the hold, host-inclusive", blocked, evidence)
    return ModeChoice("hold", "no forward waits on the device inside its call", blocked, evidence)


@dataclass(frozen=True)
class Clock:
    """One clock's paired speedup estimate and the per-call medians it came from."""

    estimate: stats.SpeedupEstimate
    ref_ms: float
    cand_ms: float
    kind: str  # the batches it was made from: "device" or "host"
    capped: dict = field(default_factory=dict)  # side → factor its device samples were scaled by (< 1)
    # "worker": the worker's times; "wall": the parent's own clock per batch; "net_wall": the candidate's times
    # from the parent's clock less the harness's own time per call, the reference's as reported
    source: str = "worker"

    def to_json(self) -> dict:
        return {"speedup": self.estimate.speedup, "ci": [self.estimate.ci_low, self.estimate.ci_high],
                "ref_ms": self.ref_ms, "cand_ms": self.cand_ms, "kind": self.kind, "capped": dict(self.capped),
                "source": self.source, "n_rounds": self.estimate.n_rounds}


def clocks(rounds: list, *, confirmed: "bool | dict", cap: bool = True) -> dict[str, Clock]:
    """The device clock (capped at each side's host-kind time), the host clock, and the parent's wall clock of
    each kind. Where the parent's clock did not confirm the worker's times (`confirmed`: one answer, or one per
    kind of batch), that clock takes the candidate's times from the parent's clock, less the harness's own time
    per call (`net_wall`, timing_control.net_wall_rounds), and the device kind is capped at the host clock's
    times the same way: a device-kind batch's wall holds the hold and, for a forward whose host work outlasts it
    (a `.cpu()` inside the call), that work after it too, so uncapped it read 1.90 ms against 1.52 ms
    host-inclusive on the H200. `cap=False` on a CPU: both kinds are the same measurement there, and capping one
    by the other's median would only add the noise of both."""
    by_kind = confirmed if isinstance(confirmed, dict) else {kind: confirmed for kind in timing_control.KINDS}
    out: dict[str, Clock] = {}
    host_walls = timing_control.wall_rounds(rounds, "host")
    device_walls = timing_control.wall_rounds(rounds, "device")
    if device_walls:
        out["wall:device"] = _capped(device_walls, host_walls if cap else [], source="wall")
    if host_walls:
        out["wall:host"] = _clock(host_walls, "host", source="wall")
    host_pairs, host_source = _pairs(rounds, "host", by_kind.get("host", True) or not device_walls)
    device_pairs, device_source = _pairs(rounds, "device", by_kind.get("device", True) or not device_walls)
    # a device clock on the parent's clock is capped on the parent's clock too: the host kind's confirmed claims
    # would set it (tests/test_timing_redteam_perkind.py::test_a_caught_device_kind_is_not_set_by_the_host_kinds_claims)
    ceiling = host_pairs if device_source == "worker" else (timing_control.net_wall_rounds(rounds, "host") or host_pairs)
    out["device"] = _capped(device_pairs, ceiling if cap else [], source=device_source)
    if host_pairs:
        out["host"] = _clock(host_pairs, "host", source=host_source)
    return out


def _pairs(rounds: list, kind: str, confirmed: bool) -> tuple[list, str]:
    """A clock's rounds: the worker's times where confirmed, else the net wall (the worker's where there is none)."""
    if not confirmed:
        net = timing_control.net_wall_rounds(rounds, kind)
        if net:
            return net, "net_wall"
    return timing_control.paired_rounds(rounds, kind), "worker"


def side_medians(pairs: list) -> dict:
    """Each side's median over every sample of paired rounds ((ref times, cand times) per round)."""
    return {side: stats.median([t for pair in pairs for t in pair[index]]) for index, side in enumerate(("ref", "cand"))}


def _capped(pairs: list, host_pairs: list, *, source: str = "worker") -> Clock:
    """A device-kind clock with each side scaled down to its own host-kind median where it was above it."""
    ceilings = side_medians(host_pairs) if host_pairs else {}
    capped, factors = stats.cap_side_medians(pairs, ceilings.get("ref"), ceilings.get("cand"))
    return _clock(capped, "device", capped=factors, source=source)


def _clock(pairs: list, kind: str, *, capped: dict | None = None, source: str = "worker") -> Clock:
    return Clock(stats.paired_speedup(pairs), stats.median([t for pair in pairs for t in pair[0]]),
                 stats.median([t for pair in pairs for t in pair[1]]), kind, capped or {}, source)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
