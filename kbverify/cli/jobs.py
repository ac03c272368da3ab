"""What each command does, end to end: load inputs, run, store, summarise. The CLI parses and calls these."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Callable

from kbverify.core.errors import InputError
from kbverify.core.progress import Progress
from kbverify.core.protocols import parse_protocols
from kbverify.core.records import Verdict
# select_entries: the benchmark scripts pick a corpus subset through this module
from kbverify.rescore.rescore_plan import RescorePlan, plan_rescore, refuse_store_conflicts, select_entries  # noqa: F401

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_RUN = REPO_ROOT / "examples" / "published_run"
DEMO_TASKS = REPO_ROOT / "tasks" / "basic"
P_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0)


def tables_by_protocol(verdicts: list[Verdict], ps, samples: str | None, exclude: set[str] | None = None) -> dict:
    """One score table per protocol; `samples` None takes each protocol's own rule, as the reports do."""
    from kbverify.results.counting import samples_rule, score_rows_from_verdicts
    from kbverify.results.score import score_rows, table_to_dict

    protocols = list(dict.fromkeys(v.protocol for v in verdicts))
    return {name: table_to_dict(score_rows(score_rows_from_verdicts([v for v in verdicts if v.protocol == name]),
                                           ps, samples=samples or samples_rule(name), exclude=exclude))
            for name in protocols}


def tables_counting_as_failed(verdicts: list[Verdict], missing: list[dict], ps, samples: str | None,
                              exclude: set[str] | None = None) -> dict:
    """The score tables with each planned unit that has no verdict (`kbverify.rescore.rescore.planned_unit`) scored as a
    failure of its task: what the run would show at worst, beside the tables of the units evaluated."""
    from kbverify.results.counting import samples_rule, score_rows_from_verdicts
    from kbverify.results.score import ScoreRow, score_rows, table_to_dict

    protocols = list(dict.fromkeys([v.protocol for v in verdicts] + [unit["protocol"] for unit in missing]))
    tables = {}
    for name in protocols:
        rows = score_rows_from_verdicts([v for v in verdicts if v.protocol == name])
        rows += [ScoreRow(task=unit["task"], level=unit["level"], sample=unit["sample"], correct=False, speedup=None,
                          labels=tuple(sorted((unit.get("labels") or {}).items())))
                 for unit in missing if unit["protocol"] == name]
        tables[name] = table_to_dict(score_rows(rows, ps, samples=samples or samples_rule(name), exclude=exclude))
    return tables


def _bound_text(bound: dict, ps) -> str:
    from kbverify.core import present

    return ("a lower bound: the same with every unit that has no verdict counted as a failure\n"
            + present.render_fast_p(bound, ps))


def run_rescore(source: Path, *, fmt: str, tasks: Path | None, store_path: Path, protocols: str, samples: str,
                report_dir: Path | None, device: str, hidden_dirs, timeout_s: float, limit: int | None = None,
                allow_mixed: bool = False, progress: Callable[[Progress], None] | None = None,
                protocol_overrides: dict | None = None, title: str | None = None, select: Path | None = None,
                exclude_path: Path | None = None, group_by: str | None = None, executor: str = "local",
                ray_address: str | None = None, clock: str = "device", share_gpu: int = 1) -> dict:
    """`device`: auto, cpu, cuda or cuda:N. `clock`: which of a verdict's clocks the tables read (kbverify.timing.clocks).
    `exclude_path`: an audit whose degenerate tasks leave the printed
    fast_p tables (listed there); the store and the reports keep every verdict. Everything the source, the tasks
    and the store can be refused for is checked before the first worker starts. `progress` hears of each phase
    and finished unit (`kbverify.core.progress`). `group_by`: a label (`kbverify.core.labels`) whose groups get side-by-side
    tables (`kbverify.report.leaderboard`), printed and in the reports. `executor`: `local` (this machine's devices) or
    `ray` (`kbverify.rescore.ray_executor`, the cluster at `ray_address`, else RAY_ADDRESS, else a local one). `share_gpu`:
    units evaluated side by side per device by the local executor (correctness shared, timing alone)."""
    from kbverify.harness.runner import CheckOptions
    from kbverify.rescore.rescore import plan_units, rescore
    from kbverify.results.store import Store

    plan = plan_rescore(source, fmt=fmt, tasks=tasks, protocols=protocols, samples=samples, limit=limit,
                        select=select, exclude_path=exclude_path, protocol_overrides=protocol_overrides)
    if group_by is not None:
        from kbverify.core.labels import require_field

        require_field(group_by, [dict(entry.labels) for entry in plan.entries], str(source))
    units = plan_units(plan.entries, plan.protocols)
    refuse_store_conflicts(store_path, units)
    if executor == "ray":
        from kbverify.rescore.ray_executor import require_ray

        require_ray()
    from kbverify.harness.sandbox import start_early

    start_early(timing=True)  # the input is sound: the worker server's torch import overlaps what follows
    device = resolve_device(device)
    options = CheckOptions(device=device, hidden_dirs=tuple(hidden_dirs), timeout_s=timeout_s)
    chosen = None
    if executor == "ray":
        from kbverify.rescore.ray_executor import RayExecutor

        chosen, devices = RayExecutor(options, address=ray_address, allow_mixed=allow_mixed), [device]
    else:
        devices = _devices_for(device)
    with Store(store_path) as store:
        arguments = {"source": str(source), "protocols": [p.name for p in plan.protocols],
                     "allow_mixed": allow_mixed, "executor": executor, "share_gpu": share_gpu}
        summary = rescore(plan.entries, plan.protocols, store, run_id=uuid.uuid4().hex[:12], devices=devices,
                          options=options, progress=progress, arguments=arguments, executor=chosen, share=share_gpu)
        runs = store.runs()
        # This source's units only: a store may also hold other runs' verdicts.
        planned = {unit.key for unit in units}
        stored = {key: v for key, v in store.verdicts() if key in planned}
    return _rescore_result(plan, units, stored, summary, source=source, store_path=store_path, samples=samples,
                           report_dir=report_dir, title=title, runs=runs, group_by=group_by, clock=clock)


def _rescore_result(plan: RescorePlan, units, stored: dict, summary, *, source: Path, store_path: Path,
                    samples: str, report_dir: Path | None, title: str | None, runs: list | None = None,
                    group_by: str | None = None, clock: str = "device") -> dict:
    from kbverify.core import present
    from kbverify.rescore.rescore import planned_unit
    from kbverify.timing import clocks

    verdicts, missing_clock = clocks.views(list(stored.values()), clock)
    # A unit an infrastructure error left without a verdict counts neither way, so the tables cover fewer tasks
    # than the run has: said first and last, and the command exits 3, so the numbers are not taken for final.
    missing_units = [planned_unit(unit) for unit in units if unit.key not in stored]
    missing = [unit["name"] for unit in missing_units]
    incomplete = incomplete_line(len(missing), len(units)) if missing else ""
    tables = tables_by_protocol(verdicts, P_VALUES, samples, plan.exclude)
    text = incomplete + _clock_line(clock, missing_clock) + present.render_fast_p(tables, P_VALUES)
    bound = None
    if missing_units:
        bound = tables_counting_as_failed(verdicts, missing_units, P_VALUES, samples, plan.exclude)
        text += _bound_text(bound, P_VALUES)
    board = None
    if group_by is not None and verdicts:
        from kbverify.report.leaderboard import board_from_verdicts, render_text

        board = board_from_verdicts(verdicts, group_by, P_VALUES, samples=samples, exclude=plan.exclude,
                                    what=str(source))
        text += render_text(board)
    text += (f"{summary.units} units ({summary.resumed} already in {store_path}, {summary.evaluated} evaluated now) in "
             f"{summary.wall_s:.0f} s\n")
    text += _changes_text(verdicts)
    text += "".join(f"infrastructure error (not counted): {error}\n" for error in summary.errors)
    text += "".join(f"not read: {file.path}: {file.reason}\n" for file in plan.skipped)
    if plan.tasks_not_found:
        text += (f"tasks not found ({len(plan.tasks_not_found)}, their entries unverifiable): "
                 f"{', '.join(plan.tasks_not_found)}\n")
    paths = {}
    if report_dir is not None:
        from kbverify.report.write import write_reports

        title = title or f"kbverify re-score of {source.name}"
        if missing:
            title += f" (INCOMPLETE: {len(missing)} of {len(units)} units without a verdict)"
        paths = write_reports(verdicts, report_dir, title=title, samples=samples, provenance={"runs": runs or []},
                              group_by=group_by)
        text += "".join(f"{kind}: {path}\n" for kind, path in paths.items())
    text += present.isolation_line(verdicts) + incomplete
    return {"text": text, "tables": tables, "units": summary.units, "evaluated": summary.evaluated,
            "resumed": summary.resumed, "errors": list(summary.errors), "wall_s": summary.wall_s,
            "complete": not missing, "missing_units": missing, "tables_counting_missing_as_failed": bound,
            "leaderboard": board,
            "reports": {k: str(v) for k, v in paths.items()},
            "skipped_files": [file.to_dict() for file in plan.skipped],
            "tasks_not_found": list(plan.tasks_not_found), "clock": clock, "missing_clock": missing_clock}


def _clock_line(clock: str, missing: int) -> str:
    """Which clock the tables read, and how many timed verdicts had no such clock (kbverify.timing.clocks)."""
    from kbverify.timing import clocks

    note = clocks.missing_note(clock, missing)
    return (note + "\n") if note else (f"clock: {clock}\n" if clock != clocks.DEFAULT_CLOCK else "")


def resolve_device(device: str) -> str:
    """`auto` asks a worker what it sees; the parent itself never imports torch. `device` is validated
    (`kbverify.cli.validate.device_name`)."""
    if device == "cpu":
        return "cpu"
    if device.startswith("cuda"):
        # Trusted as asked: the first worker brings CUDA up before any candidate code and fails with exit 3 if
        # there is none, which saves a probe process per command.
        return device if ":" in device else "cuda:0"
    from kbverify.harness.sandbox import run_child

    probe = run_child("probe", {"device": "cpu"}, timeout_s=120, device="cuda:all").result or {}
    return "cuda:0" if probe.get("cuda_available") else "cpu"


def _devices_for(device: str) -> list[str]:
    """One worker per visible GPU."""
    if device == "cpu":
        return ["cpu"]
    from kbverify.harness.sandbox import run_child

    probe = run_child("probe", {"device": "cpu"}, timeout_s=120, device="cuda:all").result or {}
    count = probe.get("device_count") or 0
    return [f"cuda:{index}" for index in range(count)] or [device]


def _changes_text(verdicts: list[Verdict]) -> str:
    from kbverify.core import present

    by_unit: dict = {}
    for verdict in verdicts:
        by_unit.setdefault((verdict.submission, verdict.sample), {})[verdict.protocol] = verdict
    lines = []
    for (submission, _), per_protocol in sorted(by_unit.items()):
        statuses = {name: v.status.value for name, v in per_protocol.items()}
        if len(set(statuses.values())) > 1:
            last = list(per_protocol.values())[-1]
            lines.append(f"  {submission}: " + " → ".join(statuses.values())
                         + (f"  ({present.shorten(last.message, 140)})" if last.message else ""))
    return ("status changes between protocols:\n" + "\n".join(lines) + "\n") if lines else ""


def run_score(source: Path, *, baseline: Path | None, level: int | None, ps, exclude_path: Path | None,
              samples: str | None, group_by: str | None = None, clock: str = "device") -> dict:
    """`samples` None: the first sample, or for a store each protocol's own rule (kbv: best). `group_by`: a label
    whose groups get side-by-side tables (`kbverify.report.leaderboard`; a store or a score JSONL). `clock`: which of a
    stored verdict's clocks the tables read (kbverify.timing.clocks); other sources carry one speedup per row."""
    from kbverify.core import present
    from kbverify.report import leaderboard
    from kbverify.results import score
    from kbverify.results.counting import foreign_gpu_line, timed_beside_foreign
    from kbverify.results.store import Store
    from kbverify.timing import clocks

    if not source.exists():
        raise InputError(f"{source}: no such file")
    exclude = None
    if exclude_path is not None:
        from kbverify.audit import load_exclusions

        exclude = load_exclusions(exclude_path)
    if baseline is not None:
        if level is None:
            raise InputError("--baseline needs --level (KernelBench's eval_results.json holds one level)")
        rows = score.read_kernelbench_eval(source, baseline, level, None)
        if group_by is not None:
            raise InputError("--group-by reads a store or a score JSONL; KernelBench's eval_results.json has no "
                             "fields to group by")
        tables = {"kernelbench": score.table_to_dict(score.score_rows(rows, ps, samples="first", exclude=exclude))}
    elif source.suffix in (".sqlite", ".db") or _is_sqlite(source):
        with Store(source, existing=True) as store:
            verdicts = [v for _, v in store.verdicts()]
            missing = store.units_without_verdict()
        verdicts, missing_clock = clocks.views(verdicts, clock)
        tables = tables_by_protocol(verdicts, ps, samples, exclude)
        text = _clock_line(clock, missing_clock) + present.render_fast_p(tables, ps)
        result = {"tables": tables, "complete": not missing, "missing_units": [unit["name"] for unit in missing],
                  "clock": clock, "missing_clock": missing_clock}
        foreign = foreign_gpu_line(verdicts)
        if foreign:
            text = foreign + "\n" + text
            result["foreign_gpu_process"] = [f"{v.task_name} {v.submission} [{v.protocol}]" for v in verdicts
                                             if timed_beside_foreign(v)]
        if group_by is not None:
            result["leaderboard"] = leaderboard.board_from_verdicts(verdicts, group_by, ps, samples=samples,
                                                                    exclude=exclude, what=str(source))
            text += leaderboard.render_text(result["leaderboard"])
        if missing:
            bound = tables_counting_as_failed(verdicts, missing, ps, samples, exclude)
            text = incomplete_line(len(missing), len(missing) + len(verdicts)) + text + _bound_text(bound, ps)
            result["tables_counting_missing_as_failed"] = bound
        return {"text": text, "json": result}
    else:
        rows = score.read_score_jsonl(source)
        tables = {"scores": score.table_to_dict(score.score_rows(rows, ps, samples=samples or "first",
                                                                 exclude=exclude))}
        if group_by is not None:
            board = leaderboard.board_from_rows(rows, group_by, ps, samples=samples or "first", exclude=exclude,
                                                what=str(source))
            return {"text": present.render_fast_p(tables, ps) + leaderboard.render_text(board),
                    "json": {"tables": tables, "complete": True, "leaderboard": board}}
    return {"text": present.render_fast_p(tables, ps), "json": {"tables": tables, "complete": True}}


def incomplete_line(missing: int, planned: int) -> str:
    return (f"INCOMPLETE: {missing} of {planned} units have no verdict (infrastructure errors or a cut run, not "
            f"counted against the kernels); the fast_p tables cover only the units evaluated. Run the rescore "
            f"again to retry them.\n")


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def run_audit(tasks: Path, *, protocols: str, out: Path | None, device: str, hidden_dirs,
              progress: Callable[[Progress], None] | None = None) -> dict:
    from kbverify import audit
    from kbverify.core.tasks import load_task_dir

    loaded = load_task_dir(tasks)
    chosen = parse_protocols(protocols)
    settings = audit.AuditSettings(hidden_dirs=tuple(str(d) for d in hidden_dirs))
    report = audit.audit_tasks(loaded, protocols=chosen, device=device, out_prefix=out, settings=settings,
                               title=tasks.name, progress=_audit_progress(progress, len(loaded), device))
    if out is not None:  # the report is written: no partial file left to read as a cut run
        from kbverify.audit.partial import finish_partial, settings_fingerprint

        finish_partial(Path(f"{out}.partial.jsonl"),
                       settings_fingerprint(protocols=chosen, device=device, settings=settings))
    summary = audit.audit_to_json_summary(report)
    lines = [f"{t['task']}: {'DEGENERATE' if t['degenerate'] else 'ok'}  {', '.join(t['flags'])}"
             for t in summary["tasks"]]
    return {"text": "\n".join(lines) + "\n", "json": summary}


def _audit_progress(progress: Callable[[Progress], None] | None, total: int, device: str):
    """The audit's per-task callback as `Progress` events, the phase's start announced at once."""
    if progress is None:
        return None
    started = time.monotonic()
    progress(Progress(0, total, phase="audit", device=device))

    def update(index: int, total: int, audit) -> None:
        spent = time.monotonic() - started
        flags = "DEGENERATE " + ", ".join(audit.flags) if audit.degenerate else (audit.error or "ok")
        progress(Progress(index, total, eta_s=spent / index * (total - index), last=f"{audit.task}: {flags}",
                          phase="audit", device=device))

    return update


def run_report(store_path: Path, out: Path, group_by: str | None = None, clock: str = "device") -> dict:
    from kbverify.report.write import write_reports
    from kbverify.results.store import Store
    from kbverify.timing import clocks

    if not store_path.exists():
        raise InputError(f"{store_path}: no such store")
    with Store(store_path, existing=True) as store:
        verdicts = [v for _, v in store.verdicts()]
        runs = store.runs()
        missing = store.units_without_verdict()
    if not verdicts:
        raise InputError(f"{store_path}: the store holds no verdicts")
    verdicts, missing_clock = clocks.views(verdicts, clock)
    title = {"title": f"kbverify report (INCOMPLETE: {len(missing)} units without a verdict)"} if missing else {}
    if clock != clocks.DEFAULT_CLOCK:
        title = {"title": title.get("title", "kbverify report") + f" ({clock} clock)"}
    paths = write_reports(verdicts, out, provenance={"runs": runs, "clock": clock, "missing_clock": missing_clock},
                          group_by=group_by, **title)
    text = _clock_line(clock, missing_clock) + "".join(f"{kind}: {path}\n" for kind, path in paths.items())
    if missing:
        text = incomplete_line(len(missing), len(missing) + len(verdicts)) + text
    return {"text": text, "paths": paths, "complete": not missing, "missing_units": [unit["name"] for unit in missing]}


def run_rejudge(store_path: Path, protocol_spec: str, into: Path | None = None) -> dict:
    """Recompute each isolated verdict's status from its stored raw evidence under `protocol_spec`'s rules.

    With `into`, a copy of the store is written there with the target protocol's own verdicts replaced by the
    rejudged ones (and a note on every run saying so), for `report`; the store itself is never changed."""
    import os

    from kbverify.results.store import Store

    if not store_path.exists():
        raise InputError(f"{store_path}: no such store")
    protocols = parse_protocols(protocol_spec)
    if len(protocols) != 1:
        raise InputError("rejudge takes one protocol")
    target = protocols[0]
    with Store(store_path, existing=True) as store:
        store.verdicts()  # a damaged store is refused before a copy of it is made
    written = _copy_store(store_path, into) if into is not None else None
    rejudged, changes = _rejudge_store(written or store_path, target, store_path, write=into is not None)
    if written is not None:
        os.replace(written, into)
    tables = tables_by_protocol(rejudged, P_VALUES, None) if rejudged else {}
    return {"text": _rejudge_text(target.name, rejudged, changes, tables, into),
            "json": {"protocol": target.name, "rejudged": len(rejudged), "changes": changes, "tables": tables}}


def _copy_store(store_path: Path, into: Path) -> Path:
    """A copy of the store beside `into`, under a name of its own until it is whole (the caller renames it)."""
    import sqlite3

    if into.exists():
        raise InputError(f"{into}: exists; rejudge writes a new store")
    # SQLite's own backup: a consistent copy even while a rescore is writing the store (a plain file copy
    # would miss what is still in its write-ahead log)
    written = into.with_name(into.name + ".partial")
    written.unlink(missing_ok=True)
    source_db, copy_db = sqlite3.connect(store_path), sqlite3.connect(written)
    try:
        source_db.backup(copy_db)
    finally:
        source_db.close()
        copy_db.close()
    return written


def _rejudge_store(path: Path, target, source: Path, *, write: bool) -> tuple[list[Verdict], list[dict]]:
    """Every verdict of the store at `path` rejudged under `target`, and the status changes. `write`: the store
    is a copy, whose verdicts of the target protocol are replaced and whose runs are annotated."""
    from kbverify.harness import provenance
    from kbverify.judge.rejudge import rejudge_verdict
    from kbverify.results.store import Store

    rejudged, changes = [], []
    with Store(path, existing=True) as store:
        for unit_key, verdict in store.verdicts():
            new = rejudge_verdict(verdict, target)
            if new is None:
                continue
            if write and verdict.protocol == target.name:
                store.replace(unit_key, new)
            rejudged.append(new)
            if new.status is not verdict.status:
                changes.append({"submission": verdict.submission, "task": verdict.task_name,
                                "from": verdict.status.value, "to": new.status.value, "message": new.message})
        if write:
            store.annotate_runs({"rejudged": target.name, "rejudged_from": str(source),
                                 "by_source_sha256": provenance.source_sha256()})
    return rejudged, changes


def _rejudge_text(name: str, rejudged: list[Verdict], changes: list[dict], tables: dict, into: Path | None) -> str:
    from kbverify.core import present

    if tables:
        text = (f"{len(rejudged)} stored verdicts rejudged under {name}'s rules from their raw evidence (no "
                f"code ran). correct: passes every {name} check on the stored input sets. A speedup is "
                f"recomputed from a verdict's stored timing rounds; a kernel that failed before it was timed has "
                f"none, and fast_p counts it as not fast.\n" + present.render_fast_p(tables, P_VALUES))
    else:
        text = "no stored verdict carries raw evidence to rejudge\n"
    text += "".join(f"  {c['submission']}: {c['from']} → {c['to']}  {present.shorten(c['message'], 120)}\n"
                    for c in changes)
    if into is not None:
        text += f"rejudged store: {into}\n"
    return text


def run_demo(out: Path, progress: Callable[[Progress], None] | None = None) -> dict:
    """The bundled example: a small published run with honest kernels and cheats, re-scored on this machine."""
    if not DEMO_RUN.is_dir() or not DEMO_TASKS.is_dir():
        raise InputError("the bundled example is missing: run the demo from a checkout of the repository")
    from kbverify.results.store import StoreConflict

    started = time.monotonic()
    # A short timing budget keeps the demo to a couple of minutes on two CPU cores; the statistics are the same.
    try:
        result = run_rescore(DEMO_RUN, fmt="kernelbench", tasks=DEMO_TASKS, store_path=out / "store.sqlite",
                             protocols="original,verified", samples="first", report_dir=out / "report",
                             device="cpu", hidden_dirs=[REPO_ROOT / "hidden_tests"], timeout_s=300.0,
                             progress=progress, protocol_overrides={"verified": {"timing_budget_s": 0.4}},
                             title="kbverify demo: the bundled example run")
    except StoreConflict:
        raise InputError(f"--out {out}: holds an earlier demo's store, made by another version of the demo; "
                         f"remove it or give --out another folder") from None
    header = (f"kbverify demo: {DEMO_RUN.relative_to(REPO_ROOT)} re-scored against "
              f"{DEMO_TASKS.relative_to(REPO_ROOT)} on the CPU under original and verified\n")
    counts, passing = _demo_reading(out / "store.sqlite")
    result["text"] = (header + counts + result["text"] + passing
                      + f"store: {out / 'store.sqlite'} (the demo run again resumes from it; `kbverify report` and "
                        f"`kbverify score` read it)\n"
                      + f"demo finished in {time.monotonic() - started:.0f} s\n")
    return result


def _demo_reading(store_path: Path) -> tuple[str, str]:
    """What the tables count (kernels against tasks, the samples fast_p leaves out), and how many kernels passed."""
    from kbverify.core.records import task_label
    from kbverify.results.store import Store

    with Store(store_path) as store:
        verified = [v for _, v in store.verdicts() if v.protocol == "verified"]
    if not verified:
        return "", ""
    tasks = {task_label(v.task_name, v.level) for v in verified}
    counts = f"{len(verified)} kernels for {len(tasks)} tasks."
    left_out = sorted((v for v in verified if v.sample > 0), key=lambda v: (v.level or 0, v.problem_id or 0))
    if left_out:
        names = ", ".join(f"{v.task_name} sample {v.sample} ({v.status.value} under verified)" for v in left_out)
        counts += f" fast_p scores one sample per task, the first, as KernelBench does, so it leaves out {names}."
    passing = sum(v.correct for v in verified)
    return counts + "\n", (f"{passing} of the {len(verified)} kernels pass verified and {len(verified) - passing} "
                            f"fail it; {DEMO_RUN.relative_to(REPO_ROOT)}/README.md says what each kernel does.\n")
