"""Audit KernelBench's levels 1–3 for degenerate tasks on a GPU, and compare with the published lists.

    python3 scripts/audit_kernelbench.py KERNELBENCH_TASKS_DIR OUT_PREFIX [--device cuda] [--levels 1,2,3]
        [--protocol original,kbv,verified] [--hidden-tests DIR] [--no-hidden] [--seeds 3] [--timeout 900]
        [--gpus N] [--per-gpu K] [--memory-budget-gib G] [--memory-factor F] [--footprints CACHE.json]
        [--peaks PEAKS.json] [--no-mps]

KERNELBENCH_TASKS_DIR holds `level1/`, `level2/`, `level3/` (KernelBench's `KernelBench/` folder). Writes
OUT_PREFIX.json, OUT_PREFIX.md and OUT_PREFIX.partial.jsonl (rerun the same command to resume after a kill).
With --gpus N --per-gpu K, N·K copies of this script share the task list (OUT_PREFIX.shardI.*): each takes the
next task no other copy has claimed, so one slow task does not hold back a fixed share of the others. Their results
are then merged into OUT_PREFIX.partial.jsonl and the report is written from it.
Memory decides what runs together: each task's need is estimated beforehand on the meta device
(kbverify.footprint), the copies take tasks largest need first, and a copy starts a task only when the needs in
flight on its GPU plus this one fit the budget (kbverify.admission); one that does not fit now is deferred and
tried again, first, whenever the copy is free.
The copies share each GPU through a private MPS daemon (kbverify.mps: their kernels run side by side instead of
taking turns). On an H200 the full audit took 408 s so; taking turns (and admitted by estimates rather than by
recorded peaks) it took 770 s. Where MPS is not available, or with --no-mps, the copies take turns, and the reason
is logged. A task whose GPU broke under MPS is audited again without it.
Nothing is downloaded. Progress goes to stderr; the comparison with the published lists (KernelBench-Verified's
exclusions, KernelBench issue #165, robust-kbench's numeric filters, METR's removals; see
reference/verified_and_hacks.md) and the total wall time go to stdout at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.admission import MemoryLedger  # noqa: E402
from kbverify.audit import (AuditSettings, audit_tasks, finished_keys, merge_partials,  # noqa: E402
                            settings_fingerprint)
from kbverify.footprint import (AUDIT_MEMORY_FACTOR, Footprint, audit_need_bytes,  # noqa: E402
                                estimate_footprints, recorded_peaks)
from kbverify.mps import MpsState, private_mps  # noqa: E402
from kbverify.protocols import parse_protocols  # noqa: E402
from kbverify.provenance import gpu_model  # noqa: E402
from kbverify.sandbox import start_early  # noqa: E402
from kbverify.tasks import load_task_dir  # noqa: E402

log = logging.getLogger("audit_kernelbench")

# Of the device's total memory, what the copies' estimated needs may add up to. The rest is for what the estimate
# leaves out: each copy's CUDA context (~0.5 GiB, ten copies ~5 GiB) and the allocator's fragmentation.
MEMORY_BUDGET_FRACTION = 0.85
# With admission, memory no longer caps the copies: the host's cores and the GPU's SMs do. The H200 machine has
# 16 cores; 250 tasks at ~26 s of worker time each (session 5) need ten or more copies busy to finish in ten
# minutes, and ten still leave cores for the launchers and forkservers.
DEFAULT_PER_GPU = 10
PEAKS_FORMAT = "kbverify-audit-peaks/1"
NEEDS_FILE = "needs.json"  # in the claims folder: each task's estimated need and the budget, for every copy

# (level, problem id). Lists made on KernelBench v0 (robust-kbench, METR) may name problems that v0.1 changed.
PUBLISHED = {
    "KernelBench-Verified exclusions (constant output)": {(2, 23), (2, 80), (2, 83)},
    "KernelBench issue #165 (zeros pass at 1e-2)": {(1, 23), (1, 37), (1, 39), (1, 53)},
    "robust-kbench numeric filters (v0)": {(1, p) for p in (23, 37, 38, 39, 50, 94, 96, 97, 98)}
    | {(2, p) for p in (9, 13, 23, 27, 36, 41, 44, 48, 49, 58, 66, 80, 84, 88, 89, 91, 96)},
    "METR removals (v0; not all for degeneracy)": {(1, p) for p in (8, 12, 23, 37, 39, 50, 77, 90, 95, 97)}
    | {(2, p) for p in (9, 13, 23, 27, 36, 38, 41, 44, 45, 49, 58, 66, 77, 80, 83, 84, 89, 91, 93, 96)}
    | {(3, p) for p in (3, 5, 7, 11, 12, 18, 28, 32, 34, 35, 45, 46, 47)},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", type=Path, help="folder holding level1/, level2/, level3/")
    parser.add_argument("out_prefix", type=Path, help="e.g. audits/kernelbench")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--protocol", default="original,kbv,verified")
    parser.add_argument("--hidden-tests", action="append", default=[], type=Path,
                        help="committed hidden-shape manifests (tasks without one get shapes generated)")
    parser.add_argument("--no-hidden", action="store_true", help="audit the tasks' own shapes only")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per task")
    parser.add_argument("--fresh", action="store_true", help="ignore OUT_PREFIX.partial.jsonl")
    parser.add_argument("--gpus", type=int, default=1, help="audit on this many GPUs of this host, one task each")
    parser.add_argument("--per-gpu", type=int, default=None,
                        help="audits sharing each GPU (the audit checks values, not speed; only its launch-bound "
                             "timing flag is measured under the others' load, next to a launch floor measured "
                             f"alike); memory admission decides which of them run at once (default: {DEFAULT_PER_GPU} "
                             "on a CUDA device, 1 on a CPU)")
    parser.add_argument("--memory-budget-gib", type=float, default=None,
                        help="device memory the copies on one GPU may reserve in all (default: "
                             f"{MEMORY_BUDGET_FRACTION:g} of its total; on a CPU device, no admission without it)")
    parser.add_argument("--memory-factor", type=float, default=AUDIT_MEMORY_FACTOR,
                        help="an audit's expected peak over its tensors' bytes, for admission (default "
                             f"{AUDIT_MEMORY_FACTOR:g}, kbverify.footprint)")
    parser.add_argument("--footprints", type=Path, default=None,
                        help="a JSON cache of the tasks' footprints by content hash: read, and completed with the "
                             "ones it lacks (measure it on a CPU beforehand to save the GPU machine that time)")
    parser.add_argument("--peaks", type=Path, default=None,
                        help="a JSON file of the tasks' recorded peak memory by content hash: used for admission "
                             "where known (kbverify.footprint.PEAK_MARGIN), and updated with this run's peaks")
    parser.add_argument("--mps", action=argparse.BooleanOptionalAction, default=True,
                        help="copies sharing a GPU run under a private CUDA MPS daemon, started and stopped by this "
                             "command, so their kernels run side by side (on by default; the GPU's settings stay as "
                             "they are; without nvidia-cuda-mps-control the copies take turns, as with --no-mps)")
    parser.add_argument("--estimate-only", action="store_true",
                        help="fill the --footprints cache and print the memory estimates' summary; audit nothing")
    parser.add_argument("--retry-per-gpu", type=int, default=2,
                        help="after the sharded pass, audit what failed (out of memory, mostly) again with this many "
                             "copies per GPU; then the rest one at a time")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: merge the copies' partial files and report what they hold (a task "
                             "without a result shows its last error)")
    parser.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # K/N: copy K of N
    parser.add_argument("--claims", default=None, type=Path, help=argparse.SUPPRESS)  # the copies' shared claims
    args = parser.parse_args()
    if args.per_gpu is None:
        args.per_gpu = DEFAULT_PER_GPU if args.device.startswith("cuda") else 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    if args.peaks is not None and not args.peaks.parent.is_dir():
        print(f"--peaks {args.peaks}: no folder {args.peaks.parent}", file=sys.stderr)
        return 2
    levels = {int(level) for level in args.levels.split(",")}
    tasks = [t for level in sorted(levels) if (args.tasks / f"level{level}").is_dir()
             for t in load_task_dir(args.tasks / f"level{level}")]
    if not tasks:
        print(f"{args.tasks}: no level{{{args.levels}}}/ task folders", file=sys.stderr)
        return 2
    if args.shard and args.claims is None:
        index, count = (int(part) for part in args.shard.split("/"))
        tasks = tasks[index::count]
    started = time.monotonic()
    sharded = args.gpus * args.per_gpu > 1 and not args.shard  # then every result is in the merged partial file
    if args.report_only:
        merge_partials(Path(f"{args.out_prefix}.partial.jsonl"), _shard_files(Path(args.out_prefix)), _fingerprint(args))
    if args.estimate_only:
        if args.footprints is None:
            print("--estimate-only needs --footprints CACHE.json", file=sys.stderr)
            return 2
        memory_needs(args, tasks)
        return 0
    needs = None
    if sharded and not args.report_only:
        needs = memory_needs(args, tasks)
    elif args.peaks is not None and not args.report_only:
        log.warning("--peaks serves the copies' memory admission; one copy runs without it and leaves %s as it was",
                    args.peaks)
    sampler = GpuSampler.start(Path(f"{args.out_prefix}.gpu_samples.csv")) if (
        needs is not None and args.device.startswith("cuda")) else None
    sharing = MpsState(False, "one copy")
    try:
        if needs is not None:
            with _sharing(args) as sharing:
                run_shards(args, args.per_gpu, fresh=args.fresh, needs=needs, env=sharing.env)
            if args.retry_per_gpu and args.retry_per_gpu < args.per_gpu:
                # What ran out of memory among many runs again among fewer, and without MPS: a task whose GPU
                # broke under MPS (whoever broke it) is audited on contexts of its own. The serial pass below
                # takes the rest.
                run_shards(args, args.retry_per_gpu, fresh=False, needs=needs)
    finally:
        if sampler is not None:
            log.info("%s", sampler.stop())
    settings = _settings(args)
    fresh_runs = []

    def progress(done: int, total: int, audit) -> None:
        if not audit.resumed:
            fresh_runs.append(audit.wall_s)
        elapsed = time.monotonic() - started
        rate = elapsed / max(1, len(fresh_runs))
        log.info("%d/%d done, %.0f s elapsed, about %.0f min left", done, total, elapsed,
                 rate * (total - done) / 60 if fresh_runs else 0.0)

    claim = release = None
    if args.claims:
        needs = _read_needs(args.claims)
        tasks = largest_first(tasks, needs)
        ledger = _ledger(args.claims, args.device, needs.get("budget_bytes"))
        claim = claimer(args.claims, elsewhere(args, settings), ledger, needs.get("needs", {}))
        release = (lambda task: ledger.release(task.key)) if ledger else None
    report = audit_tasks(tasks, protocols=parse_protocols(args.protocol), device=args.device,
                         out_prefix=args.out_prefix, resume=sharded or args.report_only or not args.fresh,
                         progress=progress, settings=settings, claim=claim, release=release,
                         title="KernelBench levels " + args.levels, run=not args.report_only)
    wall_s = time.monotonic() - started
    if args.shard:
        return 0
    print(compare_with_published(report))
    if needs is not None:
        print(memory_check(Path(f"{args.out_prefix}.partial.jsonl"), needs["needs"]))
        if args.peaks is not None:
            print(update_peaks(args.peaks, Path(f"{args.out_prefix}.partial.jsonl"), _fingerprint(args)))
    if needs is not None:
        print(f"\ncopies per device: {args.per_gpu}; {sharing.describe()}")
    print(f"\nwrote {args.out_prefix}.json and {args.out_prefix}.md")
    print(f"total wall time: {wall_s:.0f} s ({wall_s / 60:.1f} min) for {len(tasks)} tasks")
    return 0


class GpuSampler:
    """nvidia-smi's view every second while the copies run: whether the GPU or memory admission is what limits
    the audit (a busy GPU cannot go faster with more copies; an idle one waits on memory or the CPU)."""

    def __init__(self, path: Path, process):
        self.path, self.process = path, process

    @classmethod
    def start(cls, path: Path) -> GpuSampler | None:
        if not shutil.which("nvidia-smi"):
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "w")
        process = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu,memory.used",
                                    "--format=csv,noheader,nounits", "-lms", "1000"], stdout=handle,
                                   stderr=subprocess.DEVNULL)
        handle.close()
        return cls(path, process)

    def stop(self) -> str:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return summarize_gpu_samples(self.path.read_text())


def summarize_gpu_samples(text: str) -> str:
    """One line from nvidia-smi's CSV samples (timestamp, index, utilization %, memory MiB)."""
    busy, memory = [], []
    for row in text.splitlines():
        parts = [part.strip() for part in row.split(",")]
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            busy.append(int(parts[2]))
            memory.append(int(parts[3]))
    if not busy:
        return "gpu: no utilization samples"
    ordered = sorted(busy)
    return (f"gpu: {len(busy)} samples, utilization median {ordered[len(ordered) // 2]}%, "
            f"at least 90% in {100 * sum(b >= 90 for b in busy) / len(busy):.0f}% of them, "
            f"below 50% in {100 * sum(b < 50 for b in busy) / len(busy):.0f}%; "
            f"memory used max {max(memory) / 1024:.1f} GiB")


def _settings(args) -> AuditSettings:
    return AuditSettings(seeds=args.seeds, hidden_shapes=not args.no_hidden, timeout_s=args.timeout,
                         hidden_dirs=tuple(str(d) for d in args.hidden_tests))


def _fingerprint(args) -> str:
    """What this invocation's results are keyed by (kbverify.audit.settings_fingerprint)."""
    return settings_fingerprint(protocols=parse_protocols(args.protocol), device=args.device, settings=_settings(args))


def _shard_files(prefix: Path) -> list[Path]:
    """Every copy's partial file under `prefix`, also those an earlier invocation with more copies left."""
    return sorted(prefix.parent.glob(f"{glob.escape(prefix.name)}.shard*.partial.jsonl"))


def elsewhere(args, settings: AuditSettings) -> set[str]:
    """Tasks whose results an earlier invocation left in another copy's partial file or in the merged one."""
    prefix = Path(str(args.out_prefix).rsplit(".shard", 1)[0])
    paths = [Path(f"{prefix}.partial.jsonl"), *_shard_files(prefix)]
    own = Path(f"{args.out_prefix}.partial.jsonl")
    return finished_keys([p for p in paths if p != own], protocols=parse_protocols(args.protocol),
                         device=args.device, settings=settings)


def claimer(folder: Path, done_elsewhere: set[str], ledger: MemoryLedger | None = None,
            needs: dict[str, int | None] | None = None):
    """A task belongs to the first copy that creates its claim file: creation with O_EXCL is atomic. With a
    `ledger`, the copy first reserves the task's need (`needs`, by key; a missing one is unknown): claim(task) is
    None while it does not fit (ask again later), and a lost race gives the reservation back."""
    folder.mkdir(parents=True, exist_ok=True)

    def claim(task) -> bool | None:
        if task.key in done_elsewhere:
            return False
        path = folder / hashlib.sha256(task.key.encode()).hexdigest()[:32]
        if path.exists():
            return False
        if ledger is not None and not ledger.try_reserve(task.key, (needs or {}).get(task.key)):
            return None
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            if ledger is not None:
                ledger.release(task.key)
            return False
        return True

    return claim


def memory_needs(args, tasks) -> dict:
    """Each task's estimated device memory (bytes; None: unknown) and the budget per GPU (None: no admission)."""
    budget = int(args.memory_budget_gib * 2**30) if args.memory_budget_gib else None
    # The estimate runs on the CPU's meta device either way; a CUDA child also reports the GPU's total memory.
    probe_device = ("cuda:0" if args.device.startswith("cuda") and budget is None and not args.estimate_only
                    else "cpu")
    started = time.monotonic()
    start_early(timing=False)  # the estimates' children never time anything (kbverify.sandbox.TIMING_PRELOAD)
    cached = _read_footprints(args.footprints)
    missing = [t for t in tasks if t.sha256 not in cached]
    if missing or budget is None:
        footprints = estimate_footprints(missing or tasks[:1], device=probe_device)
        if budget is None and footprints.device_total_bytes:
            budget = int(footprints.device_total_bytes * MEMORY_BUDGET_FRACTION)
        by_sha = {t.key: t.sha256 for t in tasks}
        cached.update({by_sha[key]: fp for key, fp in footprints.by_key.items() if key in by_sha})
        if args.footprints and missing:
            args.footprints.write_text(json.dumps({sha: dataclasses.asdict(fp) for sha, fp in sorted(cached.items())},
                                                  indent=0))
    fingerprint = _fingerprint(args)
    peaks = read_peaks(args.peaks, fingerprint=fingerprint,
                       gpu=gpu_model() if args.peaks and args.device.startswith("cuda") else None)
    needs = {t.key: audit_need_bytes(cached.get(t.sha256), args.memory_factor,
                                     recorded_peak_bytes=peaks["peaks_reserved_bytes"].get(t.sha256))
             for t in tasks}
    unknown = sorted(key for key, need in needs.items() if need is None)
    recorded = sum(1 for t in tasks if t.sha256 in peaks["peaks_reserved_bytes"])
    log.info("estimated %d tasks' memory in %.1f s (measured %d of %d, the rest from the cache; factor %g; "
             "%d from peaks recorded on %s): budget %s, %d over it, %d unknown%s", len(needs),
             time.monotonic() - started, len(missing), len(tasks), args.memory_factor, recorded,
             peaks.get("gpu") or "no GPU", f"{budget / 2**30:.1f} GiB" if budget else "none (no admission)",
             sum(1 for need in needs.values() if budget and need is not None and need > budget), len(unknown),
             f" ({', '.join(unknown[:5])})" if unknown else "")
    return {"budget_bytes": budget, "needs": needs}


def read_peaks(path: Path | None, *, fingerprint: str | None = None, gpu: str | None = None) -> dict:
    """The peaks file, or an empty one where it is missing, or was recorded under other audit settings (hidden
    shapes and seeds change what a task's audit holds) or on another kind of GPU (`gpu`, when known)."""
    empty = {"peaks_reserved_bytes": {}}
    if path is None or not path.exists():
        return empty
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"{path}: not a readable {PEAKS_FORMAT} file ({error})") from None
    if (not isinstance(data, dict) or data.get("format") != PEAKS_FORMAT
            or not isinstance(data.get("peaks_reserved_bytes"), dict)):
        raise SystemExit(f"{path}: not a {PEAKS_FORMAT} file")
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
    records = [json.loads(line) for line in partial.read_text().splitlines() if line.strip()] if partial.exists() else []
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


def largest_first(tasks, needs: dict) -> list:
    """Long heavy tasks start early and small ones fill the gaps; an unknown need counts as the largest."""
    by_key = needs.get("needs", {})

    def need(task) -> float:
        value = by_key.get(task.key, 0)  # a task not estimated (no needs at all) keeps its place
        return math.inf if value is None else value

    return sorted(tasks, key=need, reverse=True)  # stable: equal needs keep the task order


def _read_needs(claims: Path) -> dict:
    try:
        return json.loads((claims / NEEDS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _ledger(claims: Path, device: str, budget: int | None) -> MemoryLedger | None:
    """The copies on one GPU share one ledger; copies on other GPUs have their own."""
    if not budget:
        return None
    return MemoryLedger(claims / f"memory-{device.replace(':', '')}", budget)


@contextlib.contextmanager
def _sharing(args):
    """A private MPS daemon for the copies with --mps on a CUDA device; a SIGTERM (`timeout`) unwinds through it,
    so the daemon is told to quit even when the run is cut."""
    if not (args.mps and args.device.startswith("cuda")):
        yield MpsState(False, "--no-mps" if not args.mps else f"device {args.device}")
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    # A short private folder: the daemon's sockets must fit a Unix socket path (108 bytes), which a deep
    # OUT_PREFIX may not. Its log is kept beside the results.
    folder = Path(tempfile.mkdtemp(prefix="kbv-mps-"))
    try:
        with private_mps(folder) as state:
            yield state
    finally:
        signal.signal(signal.SIGTERM, previous)
        control_log = folder / "log" / "control.log"
        if control_log.exists():
            shutil.copyfile(control_log, f"{args.out_prefix}.mps-control.log")
        shutil.rmtree(folder, ignore_errors=True)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def run_shards(args, per_gpu: int, *, fresh: bool, needs: dict | None = None, env: dict | None = None) -> None:
    """`per_gpu` copies of this script per GPU sharing one task list; their partial files merged into ours."""
    processes = []
    shards = args.gpus * per_gpu
    # Fresh claims for every invocation: a task claimed by a copy killed before it finished is free again.
    claims = Path(f"{args.out_prefix}.claims-{os.getpid()}-{time.time_ns()}")
    claims.mkdir(parents=True)
    (claims / NEEDS_FILE).write_text(json.dumps(needs or {}))
    if fresh:
        prefix = Path(args.out_prefix)
        for stale in [Path(f"{prefix}.partial.jsonl"), *_shard_files(prefix)]:
            stale.unlink(missing_ok=True)
    for index in range(shards):
        device = f"cuda:{index % args.gpus}" if args.device.startswith("cuda") else args.device
        command = [sys.executable, __file__, str(args.tasks), f"{args.out_prefix}.shard{index}", "--device", device,
                   "--levels", args.levels, "--protocol", args.protocol, "--seeds", str(args.seeds),
                   "--timeout", str(args.timeout), "--shard", f"{index}/{shards}", "--claims", str(claims)]
        command += [f"--hidden-tests={d}" for d in args.hidden_tests]
        command += ["--no-hidden"] * args.no_hidden
        processes.append(subprocess.Popen(command, env={**os.environ, **env} if env else None))
    try:
        codes = [process.wait() for process in processes]
    except BaseException:
        # this script was told to stop: so are its copies, before their MPS daemon (if any) is told to quit
        _stop(processes)
        raise
    log.info("shards finished with exit codes %s", codes)
    merged = Path(f"{args.out_prefix}.partial.jsonl")
    merged.parent.mkdir(parents=True, exist_ok=True)
    prefix = Path(args.out_prefix)
    lines = merge_partials(merged, _shard_files(prefix), _fingerprint(args))
    log.info("merged the copies' results: %d tasks in %s", lines, merged)
    shutil.rmtree(claims, ignore_errors=True)


def _stop(processes, grace_s: float = 10.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()


def compare_with_published(report) -> str:
    by_id = {(a.level, _problem_id(a.name)): a for a in report.tasks}
    lines = [f"\n{sum(a.degenerate for a in report.tasks)} of {len(report.tasks)} tasks degenerate, "
             f"{sum(a.error is not None for a in report.tasks)} errors"]
    for title, ids in PUBLISHED.items():
        present = sorted(i for i in ids if i in by_id)
        agreed = [i for i in present if by_id[i].degenerate]
        lines.append(f"\n{title}: {len(agreed)} of {len(present)} present are degenerate here")
        for i in present:
            audit = by_id[i]
            mark = "DEGENERATE" if audit.degenerate else ("error" if audit.error else "kept")
            lines.append(f"  {audit.task:60s} {mark:10s} {audit.error or ', '.join(_main_flags(audit))}")
    listed = set().union(*PUBLISHED.values())
    extra = [a for key, a in sorted(by_id.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0))
             if a.degenerate and key not in listed]
    lines.append(f"\ndegenerate here, on no published list: {len(extra)}")
    lines += [f"  {a.task:60s} under {', '.join(a.degenerate_under)}: {', '.join(_main_flags(a))}" for a in extra]
    return "\n".join(lines)


def _main_flags(audit) -> list[str]:
    return [f for f in audit.flags if not f.startswith(("trivially_passable:bf16", "trivially_passable:fp16"))]


def _problem_id(name: str) -> int | None:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else None


if __name__ == "__main__":
    sys.exit(main())
