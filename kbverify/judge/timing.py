"""The timing verdict, from the raw record alone (SPEC §5): speedup, CI and speed class, the timing mode and both
clocks (kbverify.timing.timing_modes), and the timing guards. Pure: `rejudge` reaches the same verdicts from a store.
"""

from __future__ import annotations

import dataclasses
import math

from kbverify.core import stats
from kbverify.core.protocols import Protocol
from kbverify.core.records import Verdict
from kbverify.core.status import Status, Warn
from kbverify.judge import confirmation
from kbverify.judge.timed_outputs import judge_timed_outputs
from kbverify.timing import timing_control, timing_modes

_SLOWING_FLAGS = {"matmul": False, "cudnn": False, "cudnn_enabled": False, "cudnn_deterministic": True,
                  "float32_matmul_precision": "highest", "mkldnn_enabled": False}


def decide_timing(verdict: Verdict, protocol: Protocol) -> Verdict:
    """Speedup, CI, speed class, the timing mode, both clocks and the timing guards, from the raw record alone."""
    record = timing_view(verdict.timing)  # a view, for reading
    clean = verdict.timing.get("clean_reference")
    on_gpu = str(verdict.timing.get("device", "cpu")).startswith("cuda")
    all_rounds = record.get("rounds", [])
    rounds = timing_control.paired_rounds(all_rounds, "device")
    if not rounds:
        return dataclasses.replace(verdict, status=Status.RUNTIME_ERROR, message="no timing rounds completed")
    choice = timing_modes.decide_mode(record, clean, on_gpu, verdict.timing.get("mode_requested", "auto"))
    by_kind, seen = _confirmation(all_rounds, protocol.rules)
    hastened = _hastened_kinds(verdict.timing, clean, on_gpu, protocol)
    for kind in hastened:
        by_kind[kind] = False
    confirmed = all(by_kind.values())
    clocks = _on_walls(timing_modes.clocks(all_rounds, confirmed=by_kind, cap=on_gpu), hastened)
    if choice.mode == "cpu" and "host" not in clocks:  # one measurement on a CPU: the host clock is the device's
        clocks["host"] = clocks["device"]
    margin = float(verdict.timing.get("noise_margin", protocol.rules.default_noise_margin))
    warnings = list(verdict.warnings)
    status, message = verdict.status, verdict.message
    if protocol.guards:  # on the device clock's capped times: the smallest a side's call is credited with
        status, message, extra = _timing_guards(record, _timed_outputs(verdict.timing), on_gpu,
                                                clocks["device"].ref_ms, clocks["device"].cand_ms, protocol)
        warnings += extra
        if status is Status.PASSED:
            status, message = verdict.status, verdict.message
    if choice.mode == "sync":  # both warn that the device clock leaves host time out; the host clock does not
        warnings = [w for w in warnings if w not in (Warn.HOST_TIME_TIMED.value, Warn.HOST_OVERHEAD.value)]
    if not confirmed:
        warnings.append(Warn.DEVICE_TIME_UNCONFIRMED.value)
    adjusted, slowed, instances = {}, False, {}
    for name in ("device", "host"):
        if name in clocks:
            adjusted[name], was_slowed, instances[name] = _adjusted(clocks[name], all_rounds, clean, protocol,
                                                                    on_gpu, by_kind[clocks[name].kind])
            slowed = slowed or (was_slowed and name == choice.headline_kind)
    if "device" in adjusted and "host" in adjusted and on_gpu:
        adjusted["device"] = _within_host(adjusted["device"], adjusted["host"])
    if slowed:
        warnings.append(Warn.REFERENCE_SLOWED.value)
    if hastened:
        warnings.append(Warn.REFERENCE_HASTENED.value)
    used = choice.headline_kind if choice.headline_kind in adjusted else "device"
    estimate, ref_ms, cand_ms = adjusted[used]
    if estimate.speedup > protocol.rules.excessive_speedup:
        warnings.append(Warn.EXCESSIVE_SPEEDUP.value)
    if _throttled(all_rounds):
        warnings.append(Warn.THROTTLED.value)
    timing = {**verdict.timing, "mode": choice.mode, "mode_reason": choice.reason, "blocked": list(choice.blocked),
              "mode_evidence": choice.evidence,
              "clock_used": used if clocks[used].source == "worker" else clocks[used].source,
              "reference_hastened": list(hastened),
              "device_time_confirmed": confirmed, "unexplained_ms": seen,
              "clocks": {name: _clock_json(clock, adjusted.get(name), instances.get(name))
                         for name, clock in clocks.items()}}
    return dataclasses.replace(
        verdict, status=status, message=message, warnings=tuple(dict.fromkeys(warnings)),
        speedup=estimate.speedup, speedup_ci=(estimate.ci_low, estimate.ci_high), timing=timing,
        speed_class=stats.classify_speed(estimate, margin), ref_time_ms=ref_ms, cand_time_ms=cand_ms)


# A side's facts kept per side by a timing worker (kbverify.worker.timing_record); each side's are read from the
# worker that served it, whatever the other wrote under that side's name.
PER_SIDE = ("settle_gaps_ms", "threads_started", "host_ms", "uncovered_calls", "hold_probe", "phase_ms_per_call")
# What a call must move, and the device's bandwidth: the floor under the candidate's time (`impossible_speed`),
# measured where no submission code ran, so a kernel cannot lower it by its word.
OF_THE_REFERENCE = ("input_bytes", "output_bytes", "peak_bandwidth_gbps", "ref_peak_memory_bytes")


def sides_view(reference: dict | None, candidate: dict | None) -> dict:
    """One record from two workers that each served one side: the candidate worker's facts, each per-side fact
    from its side's own worker, and the reference's measures of the work (`OF_THE_REFERENCE`)."""
    reference, candidate = dict(reference or {}), dict(candidate or {})
    view = {**candidate}
    for key in PER_SIDE:
        mine = {side: (record.get(key) or {}).get(side) for side, record in (("ref", reference), ("cand", candidate))
                if isinstance(record.get(key), dict) and side in record[key]}
        view[key] = mine if mine or isinstance(candidate.get(key), dict) else candidate.get(key)
    for key in OF_THE_REFERENCE:
        view[key] = reference.get(key)
    return view


def timing_view(timing: dict) -> dict:
    """The timing record as the rules read it, with the parent's rounds: stores made before the reference had a
    worker of its own (no `reference_worker`) hold both sides in the one worker's record."""
    worker = timing["interleaved"]
    if timing.get("reference_worker") is not None:
        worker = sides_view(timing["reference_worker"], worker)
    return {**worker, "rounds": driven_rounds(timing)}


def driven_rounds(timing: dict) -> list:
    """The rounds the parent drove and recorded (`timing["rounds"]`); stores made before the record was kept
    apart hold them inside the worker's record."""
    if "rounds" in timing:
        return timing["rounds"] or []
    return (timing.get("interleaved") or {}).get("rounds") or []


def _timed_outputs(timing: dict) -> dict:
    """The clean check's record of the timed outputs; stores made before it was kept apart hold it inside the
    worker's record."""
    return timing.get("timed_outputs") or timing["interleaved"].get("stale") or {}


def _throttled(rounds: list) -> bool:
    """The SM clock fell below 90% of its highest while timing."""
    sm_clocks = [r.get("sm_clock_mhz") for r in rounds if r.get("sm_clock_mhz")]
    return bool(sm_clocks) and min(sm_clocks) < 0.9 * max(sm_clocks)


def _confirmation(rounds: list, rules) -> tuple[dict, dict]:
    """Whether the parent's clock confirms the worker's times, per kind of batch (timing_control.
    device_time_confirmed), each clock on its own batches: judged together, device-kind times inflated into the
    hold's share of their batch paid for host-kind times shrunk tenfold, and a forward that waits on the device
    (it waits out the hold inside its call: 0.11 ms a call more unexplained than the reference on an H100) had its
    host clock, the one its verdict reads, sent to the net wall with its device kind's."""
    by_kind, seen = {}, {**confirmation.unexplained_ms(rounds), "by_kind": {}}
    for kind in timing_control.KINDS:
        by_kind[kind], seen["by_kind"][kind] = confirmation.device_time_confirmed(rounds, rules, kinds=(kind,))
    return by_kind, seen


def _hastened_kinds(timing: dict, clean: dict | None, on_gpu: bool, protocol: Protocol) -> tuple:
    """The kinds of batch whose reference, beside the candidate, read faster than the clean process's beyond the
    tolerance. Both sides' times come from the candidate's process: shrunk alike, they leave the parent's clock
    no more unexplained on one side than on the other, so the confirmation passes them, and the speedup grows
    (tests/test_timing_redteam_perkind.py::test_a_shared_shrink_past_the_tolerance_reads_the_walls). A slowed
    reference is taken against the clean time (`_against_clean_reference`); a hastened one voids both sides'
    reported times. A reference timed in a worker of its own (`reference_worker`) has no times of the candidate's
    process to be hastened by."""
    if not protocol.guards or timing.get("reference_worker") is not None:
        return ()
    rounds = driven_rounds(timing)
    tolerance = protocol.rules.slowdown_tolerance(on_gpu)
    out = []
    for kind in timing_control.KINDS:
        cap = on_gpu and kind == "device"
        offset = _reference_offset(_by_distribution(rounds, kind, cap),
                                   _by_distribution((clean or {}).get("rounds") or [], kind, cap))
        if offset is not None and math.exp(-offset) > tolerance:
            out.append(kind)
    return tuple(out)


def _on_walls(clocks: dict, hastened: tuple) -> dict:
    """Each clock of a hastened kind on the parent's own wall around both sides' batches (their calls back to
    back, and the little harness work between them): no number the candidate's process reported is in it."""
    out = dict(clocks)
    for name in ("device", "host"):
        wall = clocks.get(f"wall:{name}")
        if name in clocks and clocks[name].kind in hastened and wall is not None:
            out[name] = wall
    return out


def _adjusted(clock, rounds: list, clean: dict | None, protocol: Protocol, on_gpu: bool, confirmed: bool):
    """One clock's estimate as a verdict reports it: against the clean process's reference where the one beside
    the candidate ran slower (never an inflated speedup), widened by what a rerun redraws. ((estimate, ref ms,
    cand ms), whether the reference was slowed, what the interval was widened by.)

    Both come from batches of the clock's own kind, the device kind capped the way the clock is (the clean
    process's too), compared distribution by distribution: every round draws one distribution in turn from a
    random start, and two processes' rounds hold them in different shares, so pooled medians of a reference
    whose cost depends on its values differ by the mix, not by the instance."""
    estimate, ref_ms, slowed = clock.estimate, clock.ref_ms, False
    kind = clock.kind
    cap = on_gpu and kind == "device"
    beside = _by_distribution(rounds, kind, cap)
    clean_groups = _by_distribution((clean or {}).get("rounds") or [], kind, cap)
    # on the CPU too: nothing else compares the reference beside the candidate; the net wall clock keeps the
    # reference's reported times, so they are compared as the worker's clock's are
    if (confirmed or clock.source == "net_wall") and protocol.guards:
        estimate, ref_ms, slowed = _against_clean_reference(estimate, ref_ms, beside, clean_groups,
                                                            protocol.rules.slowdown_tolerance(on_gpu))
    differences = _instance_differences(beside, clean_groups, slowed)
    spread, dof = stats.instance_spread(differences)
    # what the interval was widened by, kept with the clock: an A/A whose paired interval is a point reads
    # as wide as these differences (one or two, through Student's t) make it
    instances = {"differences": differences, "spread": spread, "dof": dof, "slowed": slowed,
                 "before_ci": [estimate.ci_low, estimate.ci_high]}
    estimate = stats.widen_for_reruns(estimate, spread, dof)
    return (estimate, ref_ms, clock.cand_ms), slowed, instances


def _within_host(device: tuple, host: tuple) -> tuple:
    """The device clock as reported, each side at most its host-inclusive time as reported (SPEC §5). The
    clocks are capped where they are made; the clean-reference adjustment replaces a slowed reference's time by
    the clean process's, on each clock separately, so the two can cross again: the device side is then lowered
    to the host time and the speedup moved with it (a lower reference, a lower speedup)."""
    (estimate, ref_ms, cand_ms), (_, host_ref, host_cand) = device, host
    factor = 1.0
    if stats.positive(host_ref) and stats.positive(ref_ms) and ref_ms > host_ref:
        factor *= host_ref / ref_ms
        ref_ms = host_ref
    if stats.positive(host_cand) and stats.positive(cand_ms) and cand_ms > host_cand:
        factor /= host_cand / cand_ms
        cand_ms = host_cand
    if factor != 1.0:
        estimate = dataclasses.replace(estimate, speedup=estimate.speedup * factor, ci_low=estimate.ci_low * factor,
                                       ci_high=estimate.ci_high * factor)
    return estimate, ref_ms, cand_ms


def _by_distribution(rounds: list, kind: str, cap: bool) -> dict[str, list]:
    """{distribution: (ref times, cand times) per round} of one kind; the device kind scaled as the device clock
    is (each side at most its own host-kind median) where `cap`."""
    ref_key, cand_key = timing_control.side_key("ref", kind), timing_control.side_key("cand", kind)
    kept = [r for r in rounds if r.get(ref_key) and r.get(cand_key)]
    pairs = [(timing_control.evened(r[ref_key]), timing_control.evened(r[cand_key])) for r in kept]
    host = timing_control.paired_rounds(rounds, "host") if cap else []
    if host and pairs:
        ceilings = timing_modes.side_medians(host)
        pairs, _ = stats.cap_side_medians(pairs, ceilings["ref"], ceilings["cand"])
    groups: dict[str, list] = {}
    for entry, pair in zip(kept, pairs):
        groups.setdefault(str(entry.get("distribution", "x1")), []).append(pair)
    return groups


def _reference_offset(beside: dict, clean: dict) -> float | None:
    """log(reference beside the candidate / the clean process's first copy), the mean over the distributions both
    timed; None when they share none."""
    shared = sorted(set(beside) & set(clean))
    if not shared:
        return None
    offsets = [math.log(stats.median([t for ref, _ in beside[name] for t in ref])
                        / stats.median([t for ref, _ in clean[name] for t in ref])) for name in shared]
    return sum(offsets) / len(offsets)


def _instance_differences(beside: dict, clean: dict, slowed: bool) -> list[float]:
    """Log-differences between independent instances of the reference: the clean process's two copies against
    each other (paired, every round), and the one timed beside the candidate against the clean process's
    (distribution by distribution). A reference slowed beside the candidate is not an instance offset (the
    speedup is already taken against the clean time).

    Each difference is read from a run of its own and carries that run's sampling noise, all of it counted as
    an instance offset here and passed through Student's t with one or two degrees of freedom: that is what
    widens an A/A whose paired interval is a point. Taking the noise's variance out (d^2 - se^2) covered 62% of
    simulated reruns where the noise matched the offsets, so it stays in: conservative, not exact."""
    clean_pairs = [pair for group in clean.values() for pair in group]
    if not clean_pairs or not beside:
        return []
    differences = [math.log(stats.paired_speedup(clean_pairs).speedup)]
    offset = _reference_offset(beside, clean)
    if not slowed and offset is not None:
        differences.append(offset)
    return differences


def _against_clean_reference(estimate, ref_ms: float, beside: dict, clean: dict, tolerance: float):
    """The reference timed beside the candidate against the same reference timed in a process the candidate never
    touched (batches of one kind, by distribution). Where it ran slower beside the candidate (by sabotage, or by
    host-side effects that launch-bound references feel), the speedup is taken against the clean time, so a
    slowed baseline never inflates it."""
    clean_pairs = [pair for group in clean.values() for pair in group]
    offset = _reference_offset(beside, clean)
    if not clean_pairs or offset is None or math.exp(offset) <= tolerance:
        return estimate, ref_ms, False
    scale = math.exp(-offset)
    # The clean time has its own uncertainty (its A/A interval against an identical copy): each side of the
    # interval widens by it, added to the paired interval's on the log scale.
    aa = stats.paired_speedup(clean_pairs)
    extra = math.log(aa.ci_high / aa.ci_low) / 2 if aa.ci_low > 0 else 0.0
    center = estimate.speedup * scale

    def widened(bound: float) -> float:
        distance = abs(math.log(bound * scale / center)) if bound > 0 and center > 0 else 0.0
        return math.hypot(distance, extra)

    scaled = dataclasses.replace(estimate, speedup=center, ci_low=center * math.exp(-widened(estimate.ci_low)),
                                 ci_high=center * math.exp(widened(estimate.ci_high)))
    return scaled, ref_ms * scale, True


def _clock_json(clock, adjusted, instances: dict | None = None) -> dict:
    entry = clock.to_json()
    if instances is not None:
        entry["instances"] = instances
    if adjusted is not None:
        estimate, ref_ms, cand_ms = adjusted
        entry["raw"] = {"speedup": entry["speedup"], "ci": entry["ci"], "ref_ms": entry["ref_ms"]}
        entry.update({"speedup": estimate.speedup, "ci": [estimate.ci_low, estimate.ci_high], "ref_ms": ref_ms,
                      "cand_ms": cand_ms})
    return entry


def refusal(record: dict) -> str:
    return "while timed, tried what a worker refuses: " + ", ".join(record["refused"])


def _timing_guards(record: dict, timed_outputs: dict, on_gpu: bool, ref_ms: float,
                   cand_ms: float, protocol: Protocol) -> tuple[Status, str, list[str]]:
    warnings: list[str] = []
    if record.get("refused"):
        return Status.EXPLOIT_TAMPER, refusal(record), warnings
    if record.get("tampered"):
        return Status.EXPLOIT_TAMPER, "changed the harness: " + ", ".join(record["tampered"][:6]), warnings
    slowing = [change for change in [record.get("flags_changed_at_import") or {}, *record.get("flags_changed", [])]
               if any(_SLOWING_FLAGS.get(key) == value for key, value in change.items())]
    if slowing or record.get("torch_functions_changed"):
        what = slowing[0] if slowing else {"replaced": record["torch_functions_changed"][:6]}
        return Status.EXPLOIT_BASELINE_TAMPER, f"changed what the baseline runs: {what}", warnings
    rules = protocol.rules
    stale = judge_timed_outputs(timed_outputs, protocol)
    if stale.status is not None:
        return stale.status, stale.message, warnings
    warnings += stale.warnings
    if record.get("n_unsettled"):
        return (Status.EXPLOIT_UNSYNCHRONIZED, f"{record['n_unsettled']} timed outputs changed after the call had "
                "returned (work still running when the end event was recorded)", warnings)
    # Records made before the settle gap existed (`gaps_ms`, which counted the harness's own projection) are
    # not judged by it.
    gaps = record.get("settle_gaps_ms") or {}
    if on_gpu and gaps.get("cand") and gaps.get("ref"):
        excess = stats.median(gaps["cand"]) - stats.median(gaps["ref"])
        if excess > max(rules.unsync_gap_min_ms, rules.unsync_gap_fraction * (cand_ms + excess)):
            return (Status.EXPLOIT_UNSYNCHRONIZED, f"the device kept working {excess:.3f} ms after the end event "
                    f"(reference: {stats.median(gaps['ref']):.3f} ms)", warnings)
    threads = (record.get("threads_started") or {}).get("cand", 0)
    if threads > 0:
        warnings.append(Warn.THREADS_STARTED.value)
    if on_gpu and _host_time_timed(record, rules):
        warnings.append(Warn.HOST_TIME_TIMED.value)
    if on_gpu and _host_overhead(record, ref_ms, rules):
        warnings.append(Warn.HOST_OVERHEAD.value)
    known = {w.value for w in Warn}
    warnings += [w for w in record.get("warnings") or [] if w in known]
    if on_gpu and record.get("peak_bandwidth_gbps") and record.get("input_bytes"):
        moved = record["input_bytes"] + record.get("output_bytes", 0)
        floor_ms = moved / (record["peak_bandwidth_gbps"] * 1e9) * 1e3
        if cand_ms < rules.impossible_margin * floor_ms:
            return (Status.EXPLOIT_IMPOSSIBLE_SPEED, f"{cand_ms:.4f} ms per call is below the time to read the inputs "
                    f"and write the outputs once ({floor_ms:.4f} ms at {record['peak_bandwidth_gbps']:.0f} GB/s)", warnings)
    return Status.PASSED, "", warnings


def _host_time_timed(record: dict, rules) -> bool:
    """More than a tenth of either side's timed calls had host work longer than the hold before them: for those the
    time includes launch overhead, and `verified` otherwise times the device's work only."""
    uncovered = record.get("uncovered_calls") or {}
    for side, key in (("ref", "ref_ms"), ("cand", "cand_ms")):
        calls = sum(len(r.get(key, ())) for r in record.get("rounds", []))
        if calls and uncovered.get(side, 0) > rules.host_timed_fraction * calls:
            return True
    return False


def _host_overhead(record: dict, ref_ms: float, rules) -> bool:
    """The device time `verified` reports leaves the host's work out. Where the candidate's host work per call
    exceeds the reference's by more than the reference's whole device time, a caller that waits for each call
    would find it slower than the reference however fast its kernels are. (Both sides' host times include the
    harness's own per-call work, which the difference cancels; a difference within the host's own jitter, tens of
    microseconds or half the reference's host time, says nothing.)"""
    host = record.get("host_ms") or {}
    ref_host, cand_host = (host.get("ref") or {}).get("p50"), (host.get("cand") or {}).get("p50")
    if not isinstance(ref_host, (int, float)) or not isinstance(cand_host, (int, float)):
        return False
    return cand_host - ref_host > max(ref_ms, rules.host_jitter_ms, 0.5 * ref_host)
