"""A rescore's plan: its entries and protocols, every input checked (InputError) before the first worker starts,
so a bad subset file, a duplicate sample or a store made by another version fails now, not hours in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.core.protocols import parse_protocols


def select_entries(entries: list, select: Path) -> list:
    """The entries a subset file names, in source order. The file is JSON with a `kernels` list of
    {"level_id", "task_id"} (the shape of a published anchor subset); every named kernel must be in the source."""
    try:
        wanted = [(int(k["level_id"]), int(k["task_id"])) for k in json.loads(Path(select).read_text())["kernels"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"{select}: not a subset file (JSON with kernels: [{{level_id, task_id}}]): {error}") from error
    named = set(wanted)
    chosen = [entry for entry in entries if (entry.level, entry.problem_id) in named]
    missing = sorted(set(wanted) - {(entry.level, entry.problem_id) for entry in chosen})
    if missing:
        raise InputError(f"{select}: {len(missing)} kernels not in the source, first {missing[:5]}")
    return chosen


@dataclass(frozen=True)
class RescorePlan:
    entries: list
    protocols: list
    exclude: set | None
    skipped: tuple  # kbverify.rescore.importers.SkippedFile
    tasks_not_found: tuple[str, ...]


def plan_rescore(source: Path, *, fmt: str, tasks: Path | None, protocols: str, samples: str, limit: int | None,
                 select: Path | None, exclude_path: Path | None, protocol_overrides: dict | None) -> RescorePlan:
    """The entries and protocols of a rescore, every input checked (InputError) before anything runs."""
    from kbverify.rescore.importers import read_source
    from kbverify.rescore.task_match import require_tasks_fit

    if samples not in ("first", "best"):
        raise InputError("--samples is first or best")
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: give a number of entries, at least 1")
    imported = read_source(source, fmt=fmt, tasks_dir=tasks)
    entries = imported.entries
    if select is not None:
        entries = select_entries(entries, select)
    if limit is not None:
        entries = entries[:limit]
    if not entries:
        raise InputError(f"{source}: no entries to re-score")
    match = require_tasks_fit(entries, fmt=imported.fmt, source=source, tasks_dir=tasks)
    exclude = None
    if exclude_path is not None:  # read before hours of evaluation, so a bad path fails now
        from kbverify.audit import load_exclusions

        exclude = load_exclusions(exclude_path)
    require_distinct_samples(entries)
    chosen = parse_protocols(protocols)
    if protocol_overrides:
        chosen = [p.with_overrides(**protocol_overrides.get(p.name, {})) for p in chosen]
    return RescorePlan(entries=entries, protocols=chosen, exclude=exclude, skipped=imported.skipped,
                        tasks_not_found=match.missing)


def refuse_store_conflicts(store_path: Path, units) -> None:
    """An existing store must read back and hold no other version of these units; a new one is not made yet."""
    from kbverify.rescore.rescore import planned_unit
    from kbverify.results.store import Store

    if not store_path.exists():
        return
    with Store(store_path) as store:
        store.refuse_conflicts({unit.key: planned_unit(unit) for unit in units})


def require_distinct_samples(entries) -> None:
    """fast_p takes one sample per task, so two entries that are the same sample of one task are refused up front,
    not after hours of evaluation."""
    from kbverify.core.labels import key as labels_key
    from kbverify.rescore.rescore import entry_task_name

    seen: dict[tuple, str] = {}
    for entry in entries:
        key = (entry.level, entry_task_name(entry), entry.sample, entry.labels)
        if key in seen:
            labels = f" with labels {labels_key(entry.labels)}" if entry.labels else ""
            raise InputError(f"entries {seen[key]!r} and {entry.entry_id!r} are both sample {entry.sample} of task "
                             f"{key[1]}{labels}: give each its own 'sample'")
        seen[key] = entry.entry_id
