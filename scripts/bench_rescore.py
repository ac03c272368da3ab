"""End-to-end cost of `rescore` per kernel (build, original, verified) and the build cache's effect on a second run.

Full mode runs the same source twice with one build cache: the first run starts from an empty cache, the second
finds every native build there. Each run gets a new store, so both evaluate every unit. Prints a table and the ratios.

    python3 scripts/bench_rescore.py examples/published_run --tasks tasks/basic --device cpu

On a GPU, where evaluating a corpus twice costs too much device time, the two halves can be measured apart:

    python3 scripts/bench_rescore.py SOURCE --select SUBSET --device cuda --builds-only --builds-json B.json
        times every native build from an empty cache (cold), then the same prebuild again (warm);
    python3 scripts/bench_rescore.py SOURCE --select SUBSET --builds-json B.json --store STORE
        adds the evaluation times a finished `rescore --store STORE` recorded for the same kernels and prints the
        per-kernel cost (build, original, verified) and the end-to-end cold/warm ratio. Evaluation does not touch the
        build cache, so a second run's evaluation costs what the first one's did. With `--store` (and without
        `--builds-json`), the per-phase split of each protocol's seconds per kernel alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def load(args) -> list:
    from kbverify.importers import load_entries
    from kbverify.jobs import select_entries

    entries = load_entries(args.source, fmt=args.format, tasks_dir=args.tasks)
    if args.select:
        entries = select_entries(entries, args.select)
    return entries[: args.limit]


def timed_builds(entries: list, device: str, workers: int) -> dict:
    """Each native submission built in its own child, `workers` at a time: seconds and outcome per content hash."""
    from kbverify.rescore import prebuild
    from kbverify.runner import CheckOptions

    unique = {}
    for entry in entries:
        if entry.submission is not None and entry.task is not None:
            unique.setdefault(entry.submission.sha256, entry)

    def one(entry):
        started = time.monotonic()
        result = prebuild([entry], CheckOptions(device=device), workers=1)
        return entry.submission.sha256, {"entry": entry.entry_id, "native": bool(result),
                                         "ok": all(r.get("ok") for r in result.values()) if result else None,
                                         "seconds": time.monotonic() - started}

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        per_kernel = dict(pool.map(one, unique.values()))
    return {"wall_s": time.monotonic() - started, "per_kernel": per_kernel}


def builds_only(args, entries: list) -> dict:
    from kbverify.runner import default_build_cache

    cache = default_build_cache()
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"{cache} is not empty: a cold build needs an empty cache (set KBVERIFY_CACHE)")
    result = {"device": args.device, "workers": args.workers, "cache": str(cache)}
    for run in ("cold", "warm"):
        result[run] = timed_builds(entries, args.device, args.workers)
    return result


def evaluation_times(store_path: Path) -> tuple[dict, dict]:
    """({submission sha256: {protocol: elapsed seconds}}, {sha256: extension built?}) from a finished rescore."""
    from kbverify.store import Store

    times: dict = {}
    built: dict = {}
    with Store(store_path) as store:
        for _, verdict in store.verdicts():
            times.setdefault(verdict.submission_sha256, {})[verdict.protocol] = verdict.elapsed_s
            if verdict.build is not None and verdict.build.extension_built is not None:
                built[verdict.submission_sha256] = verdict.build.extension_built
    return times, built


def print_split(entries: list, builds: dict, evaluation: dict, built: dict) -> None:
    protocols = sorted({p for per in evaluation.values() for p in per})
    rows = []
    for entry in entries:
        sha = entry.submission.sha256 if entry.submission else None
        if sha not in evaluation or sha not in builds["cold"]["per_kernel"]:
            continue
        cold = builds["cold"]["per_kernel"][sha]
        warm = builds["warm"]["per_kernel"][sha]
        rows.append((entry.entry_id, built.get(sha), cold, warm, [evaluation[sha].get(p) for p in protocols]))
    print(f"{len(rows)} kernels with both a timed build and stored verdicts; builds on {builds['workers']} workers")
    print("| kernel | native | build cold s | build warm s | " + " | ".join(f"{p} s" for p in protocols) + " |")
    print("|---|---|---|---|" + "---|" * len(protocols))
    for name, extension_built, cold, warm, evals in rows:
        # a submission may catch its failed build and fall back to PyTorch: the verdict knows which happened
        native = "no" if not cold["native"] else {True: "built", False: "build failed"}.get(extension_built, "?")
        print(f"| {name} | {native} | {cold['seconds']:.1f} | {warm['seconds']:.1f} | "
              + " | ".join("–" if e is None else f"{e:.1f}" for e in evals) + " |")
    medians = [statistics.median(e[i] for *_, e in rows if e[i] is not None) for i in range(len(protocols))]
    print(f"| median | | {statistics.median(row[2]['seconds'] for row in rows):.1f} | "
          f"{statistics.median(row[3]['seconds'] for row in rows):.1f} | " + " | ".join(f"{m:.1f}" for m in medians) + " |")
    native = [row for row in rows if row[2]["native"]]
    if native:
        print(f"| median, native sources only ({len(native)}) | | "
              f"{statistics.median(row[2]['seconds'] for row in native):.1f} | "
              f"{statistics.median(row[3]['seconds'] for row in native):.1f} | |")
    evaluation_s = sum(e for *_, evals in rows for e in evals if e is not None)
    cold_s, warm_s = builds["cold"]["wall_s"] + evaluation_s, builds["warm"]["wall_s"] + evaluation_s
    print(f"prebuild wall: cold {builds['cold']['wall_s']:.1f} s, warm {builds['warm']['wall_s']:.1f} s "
          f"= {builds['cold']['wall_s'] / max(builds['warm']['wall_s'], 1e-9):.1f}x")
    print(f"end to end (prebuild wall + serial evaluation {evaluation_s:.0f} s): cold {cold_s:.0f} s, warm {warm_s:.0f} s "
          f"= {cold_s / warm_s:.2f}x from the build cache")


def print_phases(store_path: Path) -> None:
    """Per kernel and protocol: the wall time, the seconds spent in timed rounds (beside the candidate and in the
    clean process), the rest (workers starting, building, input sets, guards), and each worker's wall seconds
    where the store has them (candidate and judge overlap in time)."""
    from kbverify.store import Store

    with Store(store_path) as store:
        verdicts = [v for _, v in store.verdicts()]
    jobs = sorted({job for v in verdicts for job in (v.worker_s or {})})
    for protocol in sorted({v.protocol for v in verdicts}):
        rows = []
        for v in sorted((v for v in verdicts if v.protocol == protocol), key=lambda v: v.submission):
            rounds_s = ((v.timing or {}).get("interleaved") or {}).get("timing_s") or 0.0
            clean_s = ((v.timing or {}).get("clean_reference") or {}).get("timing_s") or 0.0
            rest_s = v.elapsed_s - rounds_s - clean_s
            rows.append((v.submission, v.status.value, v.elapsed_s, rounds_s, clean_s, rest_s,
                         [(v.worker_s or {}).get(job) for job in jobs]))
        print(f"\n{protocol}: {len(rows)} kernels, seconds per kernel")
        print("| kernel | status | total | timed rounds | clean reference rounds | rest |"
              + "".join(f" {job} worker |" for job in jobs))
        print("|---|---|---|---|---|---|" + "---|" * len(jobs))
        show = lambda x: "–" if x is None else f"{x:.1f}"
        for name, status, *numbers, workers in rows:
            print(f"| {name} | {status} | " + " | ".join(show(x) for x in [*numbers, *workers]) + " |")
        columns = list(zip(*[(*r[2:6], *r[6]) for r in rows]))
        medians = [statistics.median(x for x in column if x is not None) if any(x is not None for x in column)
                   else None for column in columns]
        print("| median | | " + " | ".join(show(m) for m in medians) + " |")


def full(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="kbv-bench-"))
    os.environ["KBVERIFY_CACHE"] = str(work / "cache")
    from kbverify import jobs
    from kbverify.rescore import prebuild
    from kbverify.runner import CheckOptions
    from kbverify.store import Store

    entries = load(args)
    rows = {}
    for run in ("cold", "warm"):
        started = time.monotonic()
        prebuild(entries, CheckOptions(device=args.device))
        build_s = time.monotonic() - started
        store_path = work / f"{run}.sqlite"
        result = jobs.run_rescore(args.source, fmt=args.format, tasks=args.tasks, store_path=store_path,
                                  protocols=args.protocol, samples="first", report_dir=None, device=args.device,
                                  hidden_dirs=[REPO / "hidden_tests"], timeout_s=900, limit=args.limit,
                                  select=args.select)
        with Store(store_path) as store:
            verdicts = [v for _, v in store.verdicts()]
        per_protocol = {}
        for verdict in verdicts:
            per_protocol.setdefault(verdict.protocol, []).append(verdict.elapsed_s)
        rows[run] = {"build_s": build_s, "wall_s": time.monotonic() - started, "rescore_s": result["wall_s"],
                     "per_protocol": per_protocol, "kernels": len(entries)}
    print(f"{len(entries)} kernels, device {args.device}")
    print("| run | prebuild s | rescore wall s | " + " | ".join(f"{p} median s/kernel" for p in rows["cold"]["per_protocol"])
          + " |")
    for run, row in rows.items():
        medians = [statistics.median(v) for v in row["per_protocol"].values()]
        print(f"| {run} | {row['build_s']:.1f} | {row['rescore_s']:.1f} | " + " | ".join(f"{m:.2f}" for m in medians) + " |")
    cold, warm = rows["cold"], rows["warm"]
    print(f"end to end, cold/warm: {cold['wall_s']:.1f} s / {warm['wall_s']:.1f} s = "
          f"{cold['wall_s'] / warm['wall_s']:.2f}x from the build cache")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--tasks", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--format", default="auto")
    parser.add_argument("--protocol", default="original,verified")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--select", type=Path, default=None, help="subset file, as rescore --select")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--builds-only", action="store_true", help="time cold and warm prebuilds, evaluate nothing")
    parser.add_argument("--builds-json", type=Path, default=None)
    parser.add_argument("--store", type=Path, default=None, help="a finished rescore's store of the same kernels")
    args = parser.parse_args()
    if args.builds_only:
        if args.builds_json is None:
            parser.error("--builds-only needs --builds-json")
        result = builds_only(args, load(args))
        args.builds_json.write_text(json.dumps(result, indent=1))
        print(f"prebuild wall: cold {result['cold']['wall_s']:.1f} s, warm {result['warm']['wall_s']:.1f} s")
    elif args.store:
        if args.builds_json is not None:
            print_split(load(args), json.loads(args.builds_json.read_text()), *evaluation_times(args.store))
        print_phases(args.store)
    else:
        full(args)


if __name__ == "__main__":
    main()
