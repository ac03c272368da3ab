"""Judging one task's raw numbers: flags, evidence and the degeneracy decision (the rules are in the package's
docstring, `kbverify.audit`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kbverify.audit.protocols import covers, every_distribution, judged_protocols, read_by_mostly
from kbverify.audit.records import INPUT_INDEPENDENT_KERNELS, AuditThresholds, TaskAudit
from kbverify.core.protocols import ALL_DISTRIBUTIONS, Protocol
from kbverify.core.tasks import Task
from kbverify.judge.correctness import judge_set


def task_identifier(name: str, level: int | None) -> str:
    return f"level{level}/{name}" if level is not None else name


def assess(task: Task, line: dict, *, protocols: Sequence[Protocol], thresholds: AuditThresholds,
           distributions: Sequence[str] = ALL_DISTRIBUTIONS, resumed: bool = False) -> TaskAudit:
    """Flags, evidence and the degeneracy decision for one task from its worker's raw numbers."""
    identity = task_identifier(task.name, task.level)
    base = dict(task=identity, key=task.key, name=task.name, level=task.level, sha256=task.sha256,
                wall_s=float(line.get("wall_s") or 0.0), resumed=resumed)
    raw = line.get("raw")
    if raw is None:
        return TaskAudit(**base, flags=(), degenerate=False, degenerate_under=(), evidence={},
                         invalid_distributions={}, hidden_shapes="none", error=line.get("error") or "no result")
    hidden = raw.get("hidden", {}).get("origin", "none")
    sets = {s["set_id"]: s for s in raw["sets"]}
    valid = {k: s for k, s in sets.items() if s["valid"]}
    if not valid:
        reasons = sorted({s.get("invalid_reason", "") for s in sets.values()} | {e["error"] for e in raw["errors"]})
        return TaskAudit(**base, flags=(), degenerate=False, degenerate_under=(), evidence={"worker_errors":
                         raw["errors"]}, invalid_distributions={}, hidden_shapes=hidden,
                         error="the reference gave no valid output: " + "; ".join(r for r in reasons if r)[:600])
    found = _Findings()
    invalid = _nonfinite(sets, found)
    _constant(raw, found, thresholds)
    _null_kernels(raw, valid, protocols, distributions, found)
    _uniform_axis(valid, found, thresholds)
    _mostly(valid, found, thresholds)
    _stochastic(raw, found, thresholds)
    _dead(raw, found, thresholds)
    _timing(raw, found, thresholds)
    evidence = dict(found.evidence)
    evidence["sets"] = {"valid": len(valid), "invalid": len(sets) - len(valid)}
    if raw.get("tf32"):
        evidence["tf32_baseline"] = {"sets": len(raw["tf32"]), "max_norm_rel": max(
            (part.get("norm_rel", 0.0) for s in raw["tf32"].values() for part in s.get("outputs", [])), default=0.0)}
    if raw["errors"]:
        evidence["worker_errors"] = raw["errors"]
    evidence["phase_s"] = raw.get("phase_s", {})
    under = _degenerate_under(found, protocols, distributions)
    return TaskAudit(**base, flags=tuple(found.flags), degenerate=bool(under), degenerate_under=tuple(under),
                     evidence=evidence, invalid_distributions=invalid, hidden_shapes=hidden, error=None)


class _Findings:
    def __init__(self):
        self.flags: list[str] = []
        self.evidence: dict = {}
        self.intrinsic = False  # degenerate whatever the protocol
        self.passes: dict[tuple[str, str], bool] = {}  # (null kernel, protocol name) → passes

    def flag(self, code: str, evidence: dict, *, intrinsic: bool = False) -> None:
        if code not in self.flags:
            self.flags.append(code)
        self.evidence[code] = evidence
        self.intrinsic |= intrinsic


def _nonfinite(sets: dict, found: _Findings) -> dict:
    invalid: dict[str, list] = {}
    for s in sets.values():
        if not s["valid"]:
            invalid.setdefault(s["distribution"], []).append({"set_id": s["set_id"], "reason": s["invalid_reason"]})
    for distribution, entries in invalid.items():
        # only a non-finite output on the task's own inputs makes it uncheckable; raising there (out of
        # memory on a smaller GPU, say) says nothing about the task
        own = distribution == "x1" and any(
            sets[e["set_id"]]["shape"] == "original" and sets[e["set_id"]]["weights"] == "default"
            and "non-finite" in e["reason"] for e in entries)
        found.flag(f"nonfinite:{distribution}", {"invalid_sets": len(entries), "example": entries[0],
                                                 "own_inputs": own}, intrinsic=own)
    return invalid


def _constant(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    constant = []
    for family in raw["families"]:
        if family["compared"] < 1:
            continue
        limit = t.constant_atol + t.constant_rtol * family["max_abs"]
        if family["max_abs_spread"] <= limit:
            constant.append({"shape": family["shape"], "weights": family["weights"], "sets": family["compared"] + 1,
                             "max_abs_spread": family["max_abs_spread"], "max_abs": family["max_abs"],
                             "limit": limit})
    if constant:
        found.flag("constant_output", {"families": constant}, intrinsic=True)


def _null_kernels(raw: dict, valid: dict, protocols: Sequence[Protocol], distributions: Sequence[str],
                  found: _Findings) -> None:
    tf32 = raw.get("tf32", {})
    for name, result in raw.get("null_kernels", {}).items():
        for protocol in protocols:
            for variant in judged_protocols(name, protocol, distributions):
                passes, detail = _passes(result, valid, tf32, variant)
                found.passes[(name, variant.name)] = passes
                if not passes or variant is not protocol:
                    continue
                code = f"near_zero:{protocol.name}" if name == "zeros" else f"trivially_passable:{name}:{protocol.name}"
                found.flag(code, detail)


def _passes(result: dict, valid: dict, tf32: dict, protocol: Protocol) -> tuple[bool, dict]:
    if result.get("error"):
        return False, {}
    checks = [c for c in result["checks"] if c["set_id"] in valid
              and covers(protocol, valid[c["set_id"]]["shape"], valid[c["set_id"]]["distribution"],
                         valid[c["set_id"]]["weights"])]
    if not checks:
        return False, {}
    worst_norm, max_ref = 0.0, 0.0
    for check in checks:
        if "screened" in check:
            # The worker retired the kernel on this set from a sample alone, because every protocol still alive
            # for it certainly rejects it there (correctness.certainly_rejects); the others had failed before.
            return False, {}
        outcome, _, _ = judge_set(check["summary"], tf32.get(check["set_id"]), protocol)
        if outcome != "passed":
            return False, {}
        for part in check["summary"].get("outputs", []):
            worst_norm = max(worst_norm, part.get("norm_rel", 0.0))
            max_ref = max(max_ref, part.get("ref_max_abs", 0.0))
    return True, {"sets_checked": len(checks), "worst_norm_rel": worst_norm, "max_abs_reference": max_ref,
                  "rule": protocol.rule, "atol": protocol.atol, "rtol": protocol.rtol}


def _uniform_axis(valid: dict, found: _Findings, t: AuditThresholds) -> None:
    verdicts: dict[tuple, dict] = {}  # (weights, output, axis) → running evidence
    for s in valid.values():
        for index, stats in enumerate(s["outputs"]):
            for axis, span in enumerate(stats.get("axis_range") or []):
                if span is None:
                    continue
                key = (s["weights"], index, axis)
                entry = verdicts.setdefault(key, {"weights": s["weights"], "output": index, "axis": axis,
                                                  "uniform": True, "max_range": 0.0, "sets": 0})
                entry["sets"] += 1
                entry["max_range"] = max(entry["max_range"], span)
                entry["uniform"] &= span <= t.uniform_axis_atol + t.uniform_axis_rtol * stats["max_abs"]
    uniform = [{k: v for k, v in e.items() if k != "uniform"} for e in verdicts.values() if e["uniform"]]
    if uniform:
        found.flag("uniform_axis", {"axes": uniform})


def _mostly(valid: dict, found: _Findings, t: AuditThresholds) -> None:
    own = [s for s in valid.values() if read_by_mostly(s)]
    if not own:
        return
    key = repr(t.mostly_atol)
    for code, stat, min_numel in (("mostly_zero", "frac_near_zero", 1), ("mostly_mean", "frac_near_mean",
                                                                          t.mostly_mean_min_numel)):
        fractions = []
        for s in own:
            parts = [o for o in s["outputs"] if stat in o and o["numel"] >= min_numel]
            total = sum(o["numel"] for o in parts)
            if total:
                fractions.append(sum(o[stat][key] * o["numel"] for o in parts) / total)
        if fractions and len(fractions) == len(own) and min(fractions) > t.mostly_fraction:
            found.flag(code, {"min_fraction": min(fractions), "sets": len(fractions), "atol": float(key),
                              "fraction_limit": t.mostly_fraction})


def _stochastic(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    runs = raw.get("stochastic", [])
    bad = [r for r in runs if not _within(r["diff_norm"], r["ref_norm"], t.stochastic_norm_rel)]
    if bad:
        worst = max(bad, key=lambda r: _relative(r["diff_norm"], r["ref_norm"]))
        found.flag("stochastic", {"sets": [r["set_id"] for r in bad], "worst_norm_rel":
                                  _relative(worst["diff_norm"], worst["ref_norm"]),
                                  "max_abs_diff": worst["max_abs_diff"], "limit": t.stochastic_norm_rel},
                   intrinsic=True)


def _within(diff_norm: float, ref_norm: float, rel: float) -> bool:
    return math.isfinite(diff_norm) and diff_norm <= rel * ref_norm


def _relative(diff_norm: float, ref_norm: float) -> float:
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def _dead(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    dead = raw.get("dead")
    if not dead:
        return
    sensitivity = {(i["kind"], i["name"]): i["sensitivity"] for i in dead["inputs"] + dead["parameters"]}
    by_kind: dict[str, list] = {"input": [], "parameter": []}
    for entry in dead["perturbed"]:
        runs = [r for r in entry["runs"] if "diff_norm" in r]
        if runs and all(_within(r["diff_norm"], r["ref_norm"], t.dead_norm_rel) for r in runs):
            by_kind[entry["kind"]].append({
                "name": entry["name"], "gradient_sensitivity": sensitivity.get((entry["kind"], entry["name"])),
                "max_norm_rel": max(_relative(r["diff_norm"], r["ref_norm"]) for r in runs), "seeds": len(runs)})
    for kind, items in by_kind.items():
        if items:
            found.flag(f"dead_{kind}", {f"{kind}s": items, "limit": t.dead_norm_rel,
                                        "gradient_error": dead.get("gradient_error", "")})


def _timing(raw: dict, found: _Findings, t: AuditThresholds) -> None:
    timing = raw.get("timing")
    if timing and timing["reference_median_us"] < t.timing_min_us:
        found.flag("timing_degenerate", {"reference_median_us": timing["reference_median_us"],
                                         "launch_floor_median_us": timing["launch_floor_median_us"],
                                         "limit_us": t.timing_min_us})
    elif timing:
        found.evidence["timing"] = {"reference_median_us": timing["reference_median_us"],
                                    "launch_floor_median_us": timing["launch_floor_median_us"]}


def _degenerate_under(found: _Findings, protocols: Sequence[Protocol], distributions: Sequence[str]) -> list[str]:
    under = []
    for protocol in protocols:
        name = protocol.name
        identity = every_distribution(protocol, distributions).name
        if (found.intrinsic or found.passes.get(("zeros", name))
                or any(found.passes.get((k, name)) for k in INPUT_INDEPENDENT_KERNELS)
                or found.passes.get(("input", identity))):
            under.append(name)
    return under
