"""End-to-end cost of `rescore` per kernel (build, original, verified) and the build cache's effect on a second run.

Runs the same source twice with one build cache: the first run starts from an empty cache, the second finds every
native build there. Each run gets a new store, so both evaluate every unit. Prints a table and the ratios.

    python3 scripts/bench_rescore.py examples/published_run --tasks tasks/basic --device cpu
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--tasks", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--format", default="auto")
    parser.add_argument("--protocol", default="original,verified")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kbv-bench-"))
    os.environ["KBVERIFY_CACHE"] = str(work / "cache")
    from kbverify import jobs
    from kbverify.importers import load_entries
    from kbverify.rescore import prebuild
    from kbverify.runner import CheckOptions
    from kbverify.store import Store

    entries = load_entries(args.source, fmt=args.format, tasks_dir=args.tasks)[: args.limit]
    rows = {}
    for run in ("cold", "warm"):
        started = time.monotonic()
        prebuild(entries, CheckOptions(device=args.device))
        build_s = time.monotonic() - started
        store_path = work / f"{run}.sqlite"
        result = jobs.run_rescore(args.source, fmt=args.format, tasks=args.tasks, store_path=store_path,
                                  protocols=args.protocol, samples="first", report_dir=None, device=args.device,
                                  hidden_dirs=[Path(__file__).resolve().parent.parent / "hidden_tests"],
                                  timeout_s=900, limit=args.limit, show_progress=False)
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


if __name__ == "__main__":
    main()
