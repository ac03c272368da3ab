"""What the audit's low-precision null kernels cost: every task audited with them on every seed and on the first
seed only (`AuditSettings.low_precision_seeds`), one after the other in this process's machine.

    python3 scripts/bench_audit.py TASKS_DIR [--device cpu] [--seeds-all 3]

Prints each task's worker seconds under both settings, the total ratio, and whether the two audits flag the
same tasks as degenerate (the low-precision passes are reported only, so they must not change that).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.audit import AuditSettings, audit_tasks  # noqa: E402
from kbverify.tasks import load_task_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", type=Path, help="a folder of task files, or one holding level1/, level2/, ...")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds-all", type=int, default=3, help="the input seeds of the original shape")
    args = parser.parse_args()
    folders = sorted(p for p in args.tasks.glob("level*") if p.is_dir()) or [args.tasks]
    tasks = [task for folder in folders for task in load_task_dir(folder)]
    results = {}
    for label, seeds in (("every seed", args.seeds_all), ("first seed", 1)):
        settings = AuditSettings(seeds=args.seeds_all, low_precision_seeds=seeds, hidden_shapes=False)
        with tempfile.TemporaryDirectory() as work:
            report = audit_tasks(tasks, protocols=["original", "kbv", "verified"], device=args.device,
                                 out_prefix=Path(work) / "bench", resume=False, settings=settings)
        results[label] = {audit.task: audit for audit in report.tasks}
    every, first = results["every seed"], results["first seed"]
    print(f"{len(tasks)} tasks, device {args.device}, hidden shapes off")
    print("| task | worker s, bf16/fp16 on every seed | on the first seed | degenerate (both) |")
    print("|---|---|---|---|")
    for name in every:
        print(f"| {name} | {every[name].wall_s:.2f} | {first[name].wall_s:.2f} | "
              f"{every[name].degenerate} / {first[name].degenerate} |")
    total_every = sum(a.wall_s for a in every.values())
    total_first = sum(a.wall_s for a in first.values())
    same = all(every[name].degenerate == first[name].degenerate for name in every)
    print(f"total: {total_every:.1f} s vs {total_first:.1f} s = {total_every / total_first:.2f}x; "
          f"degenerate verdicts {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
