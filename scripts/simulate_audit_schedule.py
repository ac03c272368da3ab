"""Replay a recorded KernelBench audit's tasks through the copies' admission rule, to compare memory factors.

    python3 scripts/simulate_audit_schedule.py PARTIAL.jsonl[.gz] FOOTPRINTS.json [--copies 10]
        [--factors 4,3.5,3.25,3] [--budgets 0.85,0.9] [--device-gib 139.8]

Each task keeps the wall time it took in the recorded run; its reservation is the factor times its tensors' bytes
(FOOTPRINTS.json, as `kbverify audit --gpus N --footprints` writes it, keyed by content hash). Tasks are taken largest
need first; a copy starts the first one whose need fits beside what runs (a need over the budget runs alone), as
`kbverify audit --gpus N` does (`kbverify.audit.copies`). Prints the makespan per factor and budget. The walls
were measured under the recorded run's contention, which another schedule changes, so read the differences, not the absolute times.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import math
import sys
from pathlib import Path

GIB = 2**30


def read_tasks(partial: Path, footprints: Path) -> list[tuple[str, float, float]]:
    """(key, tensor GiB, wall seconds) of every task with a result."""
    opener = gzip.open if partial.suffix == ".gz" else open
    with opener(partial, "rt") as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    sizes = json.loads(footprints.read_text())
    tasks = []
    for line in lines:
        footprint = sizes.get(line["sha256"], {})
        tensor = sum(footprint.get(part) or 0 for part in ("input_bytes", "parameter_bytes", "output_bytes"))
        # an unknown footprint counts as the largest and runs alone, as in kbverify.audit.copies
        unknown = footprint.get("status", "unknown") == "unknown"
        tasks.append((line["key"], math.inf if unknown else tensor / GIB, float(line["wall_s"])))
    return tasks


def makespan(tasks: list[tuple[str, float, float]], *, factor: float, budget_gib: float, copies: int) -> float:
    queue = sorted(((key, tensor * factor, wall) for key, tensor, wall in tasks), key=lambda t: -t[1])  # stable
    running: list[tuple[float, float]] = []  # (end time, need)
    now, held = 0.0, 0.0
    while queue or running:
        while len(running) < copies:
            fits = next((i for i, (_, need, _) in enumerate(queue)
                         if need <= budget_gib - held or (need > budget_gib and not running)), None)
            if fits is None:
                break
            _, need, wall = queue.pop(fits)
            charge = min(need, budget_gib)  # one over the budget (or unknown) holds all of it, as in the ledger
            heapq.heappush(running, (now + wall, charge))
            held += charge
        now, charge = heapq.heappop(running)
        held -= charge
    return now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("partial", type=Path)
    parser.add_argument("footprints", type=Path)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--factors", default="4,3.5,3.25,3")
    parser.add_argument("--budgets", default="0.85,0.9", help="fractions of the device's memory")
    parser.add_argument("--device-gib", type=float, default=139.8)
    args = parser.parse_args()
    tasks = read_tasks(args.partial, args.footprints)
    print(f"{len(tasks)} tasks, {sum(t[2] for t in tasks):.0f} s of recorded worker time, {args.copies} copies")
    for factor in (float(f) for f in args.factors.split(",")):
        cells = [f"budget {fraction:g}: {makespan(tasks, factor=factor, budget_gib=args.device_gib * fraction, copies=args.copies):.0f} s"
                 for fraction in (float(b) for b in args.budgets.split(","))]
        print(f"factor {factor:g}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
