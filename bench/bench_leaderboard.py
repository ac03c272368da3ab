"""What re-scoring a corpus costs, end to end: builds, evaluation and total wall, the GPU's busy fraction, each
kernel's cost by phase, and the build cache's effect on a second run.

    python3 bench/bench_leaderboard.py examples/published_run --tasks tasks/basic --device cpu --out /tmp/bench

Run 1 starts from an empty build cache (`OUT/cache`), run 2 (`--runs 2`, the default) from the cache run 1 left;
each run has a store of its own, so both evaluate every unit. `--phased` builds everything before the first
evaluation (no overlap of the two): its statuses must equal the pipeline's (`--compare A B` prints
every unit whose status differs between two stores). The GPU's utilisation is sampled with nvidia-smi every
`--sample-s` seconds where it exists. The table goes to stdout and `OUT/bench.json` holds every number.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class GpuSampler:
    """utilization.gpu of every GPU, every `period_s`, from nvidia-smi; nothing where there is none."""

    def __init__(self, period_s: float):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        self.available = shutil.which("nvidia-smi") is not None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.available:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            values = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]
            if values:
                self.samples.append((time.monotonic(), values))

    def busy(self) -> dict | None:
        """Mean utilisation (the share of time a kernel ran) and the share of samples with any, per GPU."""
        if not self.samples:
            return None
        per_gpu = list(zip(*[values for _, values in self.samples]))
        return {"samples": len(self.samples),
                "mean_utilization": [statistics.fmean(v) / 100 for v in per_gpu],
                "share_of_samples_busy": [sum(x > 0 for x in v) / len(v) for v in per_gpu]}


class PhaseClock:
    """Progress events with their times: when the builds and the evaluation started and ended."""

    def __init__(self):
        self.first, self.last, self.lock = {}, {}, threading.Lock()

    def __call__(self, event) -> None:
        now = time.monotonic()
        with self.lock:
            self.first.setdefault(event.phase, now)
            if event.done:
                self.last[event.phase] = now

    def span(self, phase: str) -> float | None:
        return self.last[phase] - self.first[phase] if phase in self.last else None


def timed_builds(record: dict):
    """Wrap the pipeline's build step so each build's wall seconds are kept (by entry id)."""
    from kbverify.rescore import rescore

    original = rescore.build_submission

    def build(entry, options):
        started = time.monotonic()
        try:
            return original(entry, options)
        finally:
            record[entry.entry_id] = time.monotonic() - started

    rescore.build_submission = build
    return lambda: setattr(rescore, "build_submission", original)


def one_run(args, name: str, out: Path) -> dict:
    from kbverify.cli import jobs
    from kbverify.harness.runner import CheckOptions
    from kbverify.rescore.rescore import prebuild

    store = out / f"{name}.sqlite"
    if not args.resume:
        store.unlink(missing_ok=True)
    builds: dict = {}
    restore = timed_builds(builds)
    clock = PhaseClock()
    started = time.monotonic()
    try:
        with GpuSampler(args.sample_s) as sampler:
            phased_s = None
            if args.phased:  # every build first, then every evaluation
                entries = _entries(args)
                prebuild(entries, CheckOptions(device=jobs.resolve_device(args.device)))
                phased_s = time.monotonic() - started
            result = jobs.run_rescore(args.source, fmt=args.format, tasks=args.tasks, store_path=store,
                                      protocols=args.protocol, samples="first", report_dir=None, device=args.device,
                                      hidden_dirs=[args.hidden_tests] if args.hidden_tests else [],
                                      timeout_s=args.timeout, limit=args.limit, select=args.select,
                                      progress=clock, executor=args.executor, group_by=args.group_by,
                                      share_gpu=args.share_gpu)
    finally:
        restore()
    wall_s = time.monotonic() - started
    return {"name": name, "store": str(store), "wall_s": wall_s, "rescore_s": result["wall_s"],
            "builds_wall_s": phased_s if args.phased else clock.span("build"), "evaluate_wall_s": clock.span("evaluate"),
            "evaluated": result["evaluated"], "errors": result["errors"], "complete": result["complete"],
            "build_s": builds, "gpu": sampler.busy(), "per_kernel": per_kernel(store, builds)}


def _entries(args) -> list:
    from kbverify.cli.jobs import select_entries
    from kbverify.rescore.importers import load_entries

    entries = load_entries(args.source, fmt=args.format, tasks_dir=args.tasks)
    return (select_entries(entries, args.select) if args.select else entries)[: args.limit]


def per_kernel(store_path: Path, builds: dict) -> dict:
    """entry id → {build: s, PROTOCOL: {status, total_s, timed_s, rest_s, workers: {kind: s}}}."""
    from kbverify.results.store import Store

    rows: dict = {}
    with Store(store_path) as store:
        for _, v in store.verdicts():
            timing = v.timing or {}
            timed_s = (((timing.get("interleaved") or {}).get("timing_s") or 0.0)
                       + ((timing.get("clean_reference") or {}).get("timing_s") or 0.0))
            row = rows.setdefault(v.submission, {"build_s": builds.get(v.submission)})
            row[v.protocol] = {"status": v.status.value, "total_s": v.elapsed_s, "timed_s": timed_s,
                               "rest_s": v.elapsed_s - timed_s, "workers": dict(v.worker_s or {})}
    return rows


def _median(values) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.1f}" if values else "–"


def _p90(values) -> str:
    values = sorted(v for v in values if v is not None)
    return f"{values[min(len(values) - 1, int(0.9 * len(values)))]:.1f}" if values else "–"


def print_run(run: dict) -> None:
    protocols = sorted({name for kernel in run["per_kernel"].values() for name in kernel if name != "build_s"})
    show = lambda x: "–" if x is None else f"{x:.0f}"
    gpu = run["gpu"]
    busy = ("n/a (no nvidia-smi)" if gpu is None else
            ", ".join(f"GPU{i} {u:.0%} (any: {b:.0%})" for i, (u, b) in
                      enumerate(zip(gpu["mean_utilization"], gpu["share_of_samples_busy"]))))
    print(f"\n## {run['name']}: end to end {run['wall_s']:.0f} s; builds {show(run['builds_wall_s'])} s wall "
          f"({len(run['build_s'])} builds); evaluation {show(run['evaluate_wall_s'])} s wall "
          f"({run['evaluated']} units); GPU busy: {busy}")
    kernels = run["per_kernel"]
    print("| phase, seconds per kernel | median | p90 | sum |\n|---|---|---|---|")
    builds = list(run["build_s"].values())
    print(f"| build | {_median(builds)} | {_p90(builds)} | {sum(builds):.0f} |")
    for protocol in protocols:
        rows = [k[protocol] for k in kernels.values() if protocol in k]
        for field in ("total_s", "timed_s", "rest_s"):
            values = [r[field] for r in rows]
            print(f"| {protocol} {field[:-2]} | {_median(values)} | {_p90(values)} | {sum(values):.0f} |")
        for kind in sorted({kind for r in rows for kind in r["workers"]}):
            values = [r["workers"].get(kind) for r in rows]
            print(f"| {protocol} {kind} worker | {_median(values)} | {_p90(values)} | "
                  f"{sum(v for v in values if v):.0f} |")


def compare(store_a: Path, store_b: Path) -> int:
    """Every unit (submission, protocol) whose status differs between two stores; exit 1 if any."""
    from kbverify.results.store import Store

    def statuses(path):
        with Store(path) as store:
            return {(v.submission, v.protocol): v.status.value for _, v in store.verdicts()}

    a, b = statuses(store_a), statuses(store_b)
    common = sorted(set(a) & set(b))
    differ = [(key, a[key], b[key]) for key in common if a[key] != b[key]]
    print(f"{len(common)} units in both stores ({len(set(a) ^ set(b))} in one only); {len(differ)} differ in status")
    for (submission, protocol), left, right in differ:
        print(f"  {submission} [{protocol}]: {left} → {right}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, nargs="?")
    parser.add_argument("--tasks", type=Path)
    parser.add_argument("--format", default="auto")
    parser.add_argument("--select", type=Path)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--protocol", default="original,verified")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--hidden-tests", type=Path)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--executor", default="local")
    parser.add_argument("--group-by")
    parser.add_argument("--runs", type=int, default=2, help="1: cold only; 2: cold, then warm from its cache")
    parser.add_argument("--phased", action="store_true", help="build everything before evaluating (the old path)")
    parser.add_argument("--share-gpu", type=int, default=1, help="rescore's --share-gpu")
    parser.add_argument("--resume", action="store_true",
                        help="keep the run's store (a run cut by a limit goes on where it stopped; its table then "
                             "covers this part only)")
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("bench-leaderboard"))
    parser.add_argument("--keep-cache", action="store_true", help="reuse OUT/cache instead of emptying it first")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("STORE_A", "STORE_B"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.source is None:
        parser.error("give a SOURCE (or --compare STORE_A STORE_B)")
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / "cache"
    if cache.exists() and not args.keep_cache:
        shutil.rmtree(cache)
    os.environ["KBVERIFY_CACHE"] = str(cache)  # read at each build: every run of this process shares it
    runs = []
    for index in range(args.runs):
        runs.append(one_run(args, ("phased-" if args.phased else "") + ("cold" if index == 0 else "warm"), args.out))
        print_run(runs[-1])
    if len(runs) == 2:
        cold, warm = runs
        print(f"\nbuild cache: end to end {cold['wall_s']:.0f} s → {warm['wall_s']:.0f} s "
              f"({cold['wall_s'] / max(warm['wall_s'], 1e-9):.2f}x); builds "
              f"{sum(cold['build_s'].values()):.0f} → {sum(warm['build_s'].values()):.0f} s of build time")
    (args.out / "bench.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                     "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
