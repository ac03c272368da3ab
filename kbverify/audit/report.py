"""The audit's reports: `<prefix>.json`, `<prefix>.md`, the `--json` summary, and reading exclusions back."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from kbverify.audit.partial import write_atomically
from kbverify.audit.records import ALWAYS_DEGENERATE, FORMAT, INPUT_INDEPENDENT_KERNELS, REPORTED_ONLY, AuditReport
from kbverify.core.errors import InputError


def write_report(report: AuditReport, out_prefix: str | Path) -> tuple[Path, Path]:
    """`<prefix>.json` (complete, machine-readable) and `<prefix>.md` (a table), each written atomically."""
    json_path, md_path = Path(f"{out_prefix}.json"), Path(f"{out_prefix}.md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(json_path, json.dumps(_json_safe(report.to_dict()), indent=1) + "\n")
    write_atomically(md_path, render_markdown(report))
    return json_path, md_path


def _json_safe(value):
    """Strict JSON: infinities and NaN become strings, so any reader can load the report."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def render_markdown(report: AuditReport) -> str:
    counts = report.to_dict()["counts"]
    lines = [f"# Degenerate-task audit: {report.title}", "",
             f"{counts['tasks']} tasks, **{counts['degenerate']} degenerate**, {counts['errors']} errors "
             f"({counts['resumed']} resumed). Device `{report.device}`, protocols {', '.join(report.protocols)}, "
             f"{report.settings.seeds} seeds × {len(report.settings.distributions)} distributions × 2 weight regimes"
             f"{' (+ hidden shapes)' if report.settings.hidden_shapes else ''}; {report.wall_s:.0f} s this run, "
             f"{sum(a.wall_s for a in report.tasks):.0f} s of worker time in all.", "",
             "Low-precision passes (the reference in bf16/fp16 passing a protocol) are a tolerance matter, listed in "
             "their own column.", "",
             "| task | degenerate | flags | evidence | low precision passes |", "|---|---|---|---|---|"]
    for audit in report.tasks:
        if audit.error is not None:
            lines.append(f"| {audit.task} | error | | {_cell(audit.error)} | |")
            continue
        verdict = f"**yes** ({', '.join(audit.degenerate_under)})" if audit.degenerate else "no"
        main = [f for f in audit.flags if not f.startswith(_LOW_PRECISION_FLAGS)]
        flags = ", ".join(f"`{f}`" for f in main)
        evidence = _cell("; ".join(_describe(code, audit.evidence.get(code, {})) for code in main))
        lines.append(f"| {audit.task} | {verdict} | {flags} | {evidence} | {_low_precision(audit.flags)} |")
    lines += ["", "## Exclusions", ""]
    lines += [f"- `{name}`" for name in report.exclusions] or ["(none)"]
    for protocol, names in report.exclusions_by_protocol.items():
        lines.append(f"\nUnder `{protocol}`: {', '.join(f'`{n}`' for n in names) or 'none'}.")
    invalid = [(a.task, d, len(e)) for a in report.tasks for d, e in a.invalid_distributions.items()]
    if invalid:
        lines += ["", "## Invalid distributions (the reference raised or went non-finite)", "",
                  "| task | distribution | sets |", "|---|---|---|"]
        lines += [f"| {task} | {distribution} | {n} |" for task, distribution, n in invalid]
    lines += ["", "## Thresholds", "", "| threshold | value |", "|---|---|"]
    lines += [f"| {k} | {v:g} |" for k, v in report.thresholds.to_dict().items()]
    lines += ["", "## What excludes a task", "",
              "- always: " + ", ".join(f"`{c}`" for c in ALWAYS_DEGENERATE),
              "- under a protocol p: `near_zero:p`, " + ", ".join(f"`trivially_passable:{k}:p`"
                                                                 for k in INPUT_INDEPENDENT_KERNELS)
              + ", and the input itself passing p's rule on every audited distribution",
              "- reported only: " + ", ".join(f"`{c}`" for c in REPORTED_ONLY), ""]
    return "\n".join(lines)


_LOW_PRECISION_FLAGS = ("trivially_passable:bf16:", "trivially_passable:fp16:")


def _low_precision(flags: Sequence[str]) -> str:
    passes: dict[str, list[str]] = {}
    for flag in flags:
        if flag.startswith(_LOW_PRECISION_FLAGS):
            _, dtype, protocol = flag.split(":")
            passes.setdefault(dtype, []).append(protocol)
    return "; ".join(f"{dtype}: {', '.join(protocols)}" for dtype, protocols in passes.items())


def _cell(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(code: str, e: dict) -> str:
    """One short phrase of evidence per flag, for the table."""
    if code == "constant_output":
        f = e["families"][0]
        return (f"constant ({f['weights']} weights): spread {f['max_abs_spread']:.2g} over {f['sets']} sets, "
                f"max|out| {f['max_abs']:.2g}")
    if code.startswith("near_zero:") or code.startswith("trivially_passable:"):
        what = "zeros" if code.startswith("near_zero:") else code.split(":")[1]
        return (f"{what} pass {code.rsplit(':', 1)[1]} on {e['sets_checked']} sets "
                f"(max|ref| {e['max_abs_reference']:.2g})")
    if code == "uniform_axis":
        return "uniform along " + ", ".join(f"axis {a['axis']} of output {a['output']} ({a['weights']})"
                                            for a in e["axes"][:3])
    if code in ("mostly_zero", "mostly_mean"):
        return f"{code.replace('_', ' ')}: ≥{e['min_fraction']:.0%} within {e['atol']:g}"
    if code in ("dead_input", "dead_parameter"):
        items = e.get("inputs", e.get("parameters", []))
        return "dead: " + ", ".join(f"{i['name']} (Δ {i['max_norm_rel']:.1g})" for i in items[:4])
    if code == "stochastic":
        return f"two reseeded runs differ by {e['worst_norm_rel']:.2g} (norm-wise)"
    if code.startswith("nonfinite:"):
        return f"{code.split(':')[1]}: {e['invalid_sets']} invalid set(s): {e['example']['reason']}"
    if code == "timing_degenerate":
        return f"reference {e['reference_median_us']:.1f} µs (launch floor {e['launch_floor_median_us']:.1f} µs)"
    return ""


def audit_to_json_summary(report: AuditReport) -> dict:
    """What `kbverify audit --json` prints (SPEC §10), plus the exclusion lists."""
    tasks = []
    for audit in report.tasks:
        entry = {"task": audit.task, "degenerate": audit.degenerate, "flags": list(audit.flags),
                 "evidence": {code: audit.evidence[code] for code in audit.flags if code in audit.evidence},
                 "degenerate_under": list(audit.degenerate_under)}
        if audit.error is not None:
            entry["error"] = audit.error
        tasks.append(entry)
    return _json_safe({"tasks": tasks, "exclusions": report.exclusions,
                       "exclusions_by_protocol": report.exclusions_by_protocol,
                       "thresholds": report.thresholds.to_dict()})


def summary_lines(summary: dict) -> list[str]:
    """One line per task of `audit_to_json_summary`'s output, for the command's text output."""
    return [f"{t['task']}: {'DEGENERATE' if t['degenerate'] else 'ok'}  {', '.join(t['flags'])}"
            for t in summary["tasks"]]


def load_exclusions(audit_json_path: str | Path, *, protocol: str | None = None) -> set[str]:
    """Task identifiers to exclude: each excluded task as "levelL/NAME" and as its bare file name "NAME".

    With `protocol`, only the tasks degenerate under that protocol (it must have been audited)."""
    path = Path(audit_json_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read audit: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not a kbverify audit (expected format {FORMAT})")
    by_protocol = data.get("exclusions_by_protocol")
    if protocol is None:
        names = data.get("exclusions")
    elif isinstance(by_protocol, dict) and protocol in by_protocol:
        names = by_protocol[protocol]
    else:
        raise InputError(f"{path}: protocol {protocol!r} was not audited "
                         f"(audited: {', '.join(map(str, data.get('protocols', [])))})")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InputError(f"{path}: its exclusions are not a list of task names")
    return {form for name in names for form in (name, name.rsplit("/", 1)[-1])}
