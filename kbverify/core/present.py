"""Text and JSON for the terminal: what `check`, `rescore` and `score` show. Pure formatting, no I/O."""

from __future__ import annotations

from kbverify.core.records import Verdict


def verdict_json(verdict: Verdict) -> dict:
    """The SPEC §10 shape of one protocol's verdict, plus the evidence a script may want."""
    failing = next((s for s in verdict.sets if s.status.value != "passed"), None)
    return {
        "status": verdict.status.value,
        "speedup": verdict.speedup,
        "speedup_ci": list(verdict.speedup_ci) if verdict.speedup_ci else None,
        "speed": verdict.speed_class,
        "warnings": list(verdict.warnings),
        "message": verdict.message,
        "ref_time_ms": verdict.ref_time_ms,
        "cand_time_ms": verdict.cand_time_ms,
        "hidden_shapes": verdict.hidden_shapes,
        "sets": {"total": len(verdict.sets), "valid": sum(s.valid for s in verdict.sets),
                 "failed": sum(s.status.value != "passed" for s in verdict.sets)},
        "failing_set": failing.set_id if failing else None,
        "reproducer": verdict.reproducer,
        "build": None if verdict.build is None else {
            "native_sources": verdict.build.native_sources, "extension_built": verdict.build.extension_built,
            "extension_called": verdict.build.extension_called, "error_class": verdict.build.error_class},
        "elapsed_s": verdict.elapsed_s,
        "isolation": verdict.isolation,
        "isolation_reason": verdict.isolation_reason,
        "timing_mode": (verdict.timing or {}).get("mode"),
        "timing_mode_reason": (verdict.timing or {}).get("mode_reason"),
        "clocks": {name: {"speedup": entry.get("speedup"), "ci": entry.get("ci")}
                   for name, entry in ((verdict.timing or {}).get("clocks") or {}).items()
                   if name in ("device", "host") and isinstance(entry, dict)} or None,
    }


def _clocks_line(verdict: Verdict) -> str:
    """Both clocks and the mode that chose the headline (kbverify.timing.timing_modes); "" for other timings."""
    timing = verdict.timing or {}
    entries = timing.get("clocks") or {}
    if timing.get("mode") in (None, "cpu") or not all(isinstance(entries.get(name), dict) for name in ("device", "host")):
        return ""  # on a CPU the two clocks are one measurement: nothing to add
    parts = []
    for name in ("device", "host"):
        entry = entries[name]
        ci = entry.get("ci") or [None, None]
        interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if all(isinstance(c, (int, float)) for c in ci) else ""
        parts.append(f"{name} {entry['speedup']:.3f}x{interval}")
    return f"clocks: {', '.join(parts)}; mode {timing['mode']}: {timing.get('mode_reason', '')}"


def pct(share: float | None) -> str:
    """A share as a percentage with one decimal; – where there is none."""
    return "–" if share is None else f"{100 * share:.1f}%"


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters ("…" marks the cut)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    cut = (head if text[limit - 1] == " " else head.rsplit(" ", 1)[0]).rstrip(",;:")
    # a single word longer than half the room (a path, a hash) is cut inside it rather than dropped
    return (cut if len(cut) >= limit // 2 else text[:limit - 1]) + "…"


def _speed(verdict: Verdict) -> str:
    if verdict.speedup is None:
        return "-"
    text = f"{verdict.speedup:.3f}x"
    if verdict.speedup_ci:
        text += f" [{verdict.speedup_ci[0]:.3f}, {verdict.speedup_ci[1]:.3f}]"
    if verdict.speed_class:
        text += f" {verdict.speed_class}"
    return text


def render_check(task_name: str, submission_id: str, verdicts: list[Verdict]) -> str:
    lines = [f"{submission_id} against {task_name}"]
    width = max(len(v.protocol) for v in verdicts)
    for verdict in verdicts:
        line = f"  {verdict.protocol:<{width}}  {verdict.status.value:<26} {_speed(verdict)}"
        if verdict.warnings:
            line += f"  warnings: {', '.join(verdict.warnings)}"
        lines.append(line)
        if verdict.message:
            lines.append(f"  {'':<{width}}  {shorten(verdict.message, 300)}")
        if _clocks_line(verdict):
            lines.append(f"  {'':<{width}}  {shorten(_clocks_line(verdict), 300)}")
        if verdict.isolation not in ("isolated", "not_run"):
            lines.append(f"  {'':<{width}}  ISOLATION: DEGRADED ({verdict.isolation_reason}): the submission ran "
                         "unconfined and could have reached the parent, the judge or their files")
        if verdict.status.value != "passed" and verdict.reproducer.get("set"):
            lines.append(f"  {'':<{width}}  rerun: --protocol {verdict.protocol} --only {verdict.reproducer['set']} "
                         f"--secret {verdict.reproducer.get('secret')}")
    return "\n".join(lines) + "\n"


def isolation_line(verdicts: list[Verdict]) -> str:
    """A run's summary names degraded isolation itself, as the reports do: a reader of stdout alone must see that
    the candidates ran unconfined. Empty when every verdict that ran submission code was isolated."""
    degraded = [v for v in verdicts if v.isolation not in ("isolated", "not_run")]
    if not degraded:
        return ""
    reasons = ", ".join(dict.fromkeys(v.isolation_reason for v in degraded if v.isolation_reason))
    return (f"isolation: degraded: {len(degraded)} of {len(verdicts)} verdicts ran unconfined"
            + (f" ({shorten(reasons, 200)})" if reasons else "") + "; treat them as unhardened\n")


def render_fast_p(tables: dict, ps) -> str:
    """Side-by-side fast_p per protocol. `tables` maps protocol → score table dict (kbverify.results.score)."""
    names = list(tables)
    header = "| p | " + " | ".join(names) + " |"
    lines = [header, "|---|" + "---|" * len(names)]
    for p in ps:
        cells = []
        for name in names:
            row = next((r for r in tables[name]["rows"] if abs(r["p"] - p) < 1e-12), None)
            if row is None:
                cells.append("-")
                continue
            cell = f"{100 * row['fast_p']:.1f}%"
            if row.get("fast_p_ci"):
                cell += f" [{100 * row['fast_p_ci'][0]:.0f}, {100 * row['fast_p_ci'][1]:.0f}]"
            if row.get("confident_fast_p") is not None:
                cell += f" (confident {100 * row['confident_fast_p']:.1f}%)"
            cells.append(cell)
        lines.append(f"| fast_{p:g} | " + " | ".join(cells) + " |")
    for name in names:
        table = tables[name]
        lines.append(_table_line(name, table))
    return "\n".join(lines) + "\n"


def _table_line(name: str, table: dict) -> str:
    """What `correct` counts, said beside the table: a correct kernel without a measured speedup (never timed)
    is fast for no p, so fast_0 can be below the share correct."""
    line = f"{name}: {table['n_tasks']} tasks, {table['n_correct']} correct"
    timed = table.get("n_geomean", table["n_correct"])
    if timed < table["n_correct"]:
        line += (f" ({table['n_correct'] - timed} of them without a measured speedup, which fast_p counts as not "
                 f"fast)")
    if table.get("geomean_speedup") is not None:
        which = "correct" if timed == table["n_correct"] else f"the {timed} timed"
        line += f", geomean speedup of {which} {table['geomean_speedup']:.3f}x"
    if table.get("excluded"):
        line += f"; excluded as degenerate: {', '.join(table['excluded'])}"
    return line
