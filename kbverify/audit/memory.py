"""What memory each task of a sharded audit is expected to need, and how that compared with what it took.

Each task's need is estimated beforehand on the meta device (`kbverify.audit.footprint`), or taken from a peak an
earlier run recorded on this kind of GPU under these settings (the peaks file); the copies' admission
(`kbverify.audit.admission`) reads the needs. After the run the estimates are checked against the recorded peaks,
so the memory factor is checked on every GPU run."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from kbverify.audit.footprint import Footprint, audit_need_bytes, estimate_footprints, recorded_peaks
from kbverify.audit.options import AuditOptions
from kbverify.core.errors import InputError
from kbverify.core.tasks import Task
from kbverify.harness.provenance import gpu_model
from kbverify.harness.sandbox import start_early

log = logging.getLogger(__name__)

# Of the device's total memory, what the copies' estimated needs may add up to. The rest is for what the estimate
# leaves out: each copy's CUDA context (~0.5 GiB, ten copies ~5 GiB) and the allocator's fragmentation.
MEMORY_BUDGET_FRACTION = 0.85
PEAKS_FORMAT = "kbverify-audit-peaks/1"


def memory_needs(options: AuditOptions, tasks: Sequence[Task]) -> dict:
    """Each task's estimated device memory (bytes; None: unknown) and the budget per GPU (None: no admission)."""
    budget = int(options.memory_budget_gib * 2**30) if options.memory_budget_gib else None
    # The estimate runs on the CPU's meta device either way; a CUDA child also reports the GPU's total memory.
    probe_device = "cuda:0" if options.on_cuda and budget is None and not options.estimate_only else "cpu"
    started = time.monotonic()
    start_early(timing=False)  # the estimates' children never time anything (kbverify.harness.sandbox.TIMING_PRELOAD)
    cached = _read_footprints(options.footprints)
    missing = [t for t in tasks if t.sha256 not in cached]
    if missing or budget is None:
        footprints = estimate_footprints(missing or tasks[:1], device=probe_device)
        if budget is None and footprints.device_total_bytes:
            budget = int(footprints.device_total_bytes * MEMORY_BUDGET_FRACTION)
        by_sha = {t.key: t.sha256 for t in tasks}
        cached.update({by_sha[key]: fp for key, fp in footprints.by_key.items() if key in by_sha})
        if options.footprints and missing:
            options.footprints.write_text(json.dumps({sha: dataclasses.asdict(fp)
                                                      for sha, fp in sorted(cached.items())}, indent=0))
    peaks = read_peaks(options.peaks, fingerprint=options.fingerprint(),
                       gpu=gpu_model() if options.peaks and options.on_cuda else None)
    needs = {t.key: audit_need_bytes(cached.get(t.sha256), options.memory_factor,
                                     recorded_peak_bytes=peaks["peaks_reserved_bytes"].get(t.sha256))
             for t in tasks}
    _log_needs(options, tasks, needs, peaks, budget, measured=len(missing), spent_s=time.monotonic() - started)
    return {"budget_bytes": budget, "needs": needs}


def _log_needs(options: AuditOptions, tasks: Sequence[Task], needs: dict, peaks: dict, budget: int | None, *,
               measured: int, spent_s: float) -> None:
    unknown = sorted(key for key, need in needs.items() if need is None)
    recorded = sum(1 for t in tasks if t.sha256 in peaks["peaks_reserved_bytes"])
    log.info("estimated %d tasks' memory in %.1f s (measured %d of %d, the rest from the cache; factor %g; "
             "%d from peaks recorded on %s): budget %s, %d over it, %d unknown%s", len(needs), spent_s, measured,
             len(tasks), options.memory_factor, recorded, peaks.get("gpu") or "no GPU",
             f"{budget / 2**30:.1f} GiB" if budget else "none (no admission)",
             sum(1 for need in needs.values() if budget and need is not None and need > budget), len(unknown),
             f" ({', '.join(unknown[:5])})" if unknown else "")


def read_peaks(path: Path | None, *, fingerprint: str | None = None, gpu: str | None = None) -> dict:
    """The peaks file, or an empty one where it is missing, or was recorded under other audit settings (hidden
    shapes and seeds change what a task's audit holds) or on another kind of GPU (`gpu`, when known)."""
    empty = {"peaks_reserved_bytes": {}}
    if path is None or not path.exists():
        return empty
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: not a readable {PEAKS_FORMAT} file ({error})") from None
    if (not isinstance(data, dict) or data.get("format") != PEAKS_FORMAT
            or not isinstance(data.get("peaks_reserved_bytes"), dict)):
        raise InputError(f"{path}: not a {PEAKS_FORMAT} file")
    if fingerprint is not None and data.get("settings_sha256") != fingerprint:
        log.warning("%s: recorded under other audit settings; its peaks are not used", path)
        return empty
    if gpu is not None and data.get("gpu") != gpu:
        log.warning("%s: recorded on %s, this is %s; its peaks are not used", path, data.get("gpu"), gpu)
        return empty
    return data


def update_peaks(path: Path, partial: Path, fingerprint: str) -> str:
    """The file keeps each task's latest recorded peak (the newest code's) under these settings; records of other
    settings are left out, and a run under other settings or on another kind of GPU starts the file over."""
    text = partial.read_text() if partial.exists() else ""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    records = [r for r in records if not r.get("error") and (r.get("raw") or {}).get("gpu")
               and r.get("settings_sha256") == fingerprint]
    if not records:
        return f"peaks: no GPU records of these settings in {partial}; {path} left as it was"
    gpu = records[-1]["raw"]["gpu"]
    kept = read_peaks(path, fingerprint=fingerprint, gpu=gpu)["peaks_reserved_bytes"]
    new = recorded_peaks(r for r in records if r["raw"]["gpu"] == gpu)
    merged = {**kept, **new}
    text = json.dumps({"format": PEAKS_FORMAT, "gpu": gpu, "torch": records[-1]["raw"].get("torch"),
                       "settings_sha256": fingerprint,
                       "note": "the allocator's reserve at each task's audit peak, by task content hash",
                       "peaks_reserved_bytes": dict(sorted(merged.items()))}, indent=0) + "\n"
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return f"peaks: {len(new)} recorded on {gpu} written to {path} ({len(merged)} tasks in all)"


def _read_footprints(path: Path | None) -> dict:
    """Footprints measured in full before (bytes on the meta device: a function of the task's source alone, keyed
    by its content hash). The others (a forward cut off at its time limit, a child that died) are measured again."""
    if path is None or not path.exists():
        return {}
    footprints = {sha: Footprint.from_dict(data) for sha, data in json.loads(path.read_text()).items()}
    return {sha: footprint for sha, footprint in footprints.items() if footprint.status == "full"}


def memory_check(partial: Path, needs: dict) -> str:
    """The estimates against the peaks the audits recorded (the allocator's reserve): how many went over, and the
    worst ratio, so the memory factor is checked on every GPU run."""
    ratios = []
    for text in partial.read_text().splitlines() if partial.exists() else ():
        line = json.loads(text)
        peak = ((line.get("raw") or {}).get("peak_memory_bytes") or {}).get("reserved")
        need = needs.get(line.get("key"))
        if peak and need:
            ratios.append((peak / need, line["key"].split("@")[0]))
    if not ratios:
        return "\nmemory: no recorded peaks to check the estimates against"
    ratios.sort(reverse=True)
    over = [f"{name} {ratio:.2f}" for ratio, name in ratios if ratio > 1.0]
    return (f"\nmemory: {len(ratios)} recorded peaks, worst peak/estimate {ratios[0][0]:.2f} ({ratios[0][1]}), "
            f"{len(over)} over their estimate" + (f": {', '.join(over[:10])}" if over else ""))
