"""How precise is a verified check of a kernel that is the reference itself (A/A), and what does it cost?

    python3 bench/bench_aa.py [--code DIR ...] [--task TASK ...] [--repeats 3] [--budget-s 2] [--device cpu]

For each task, the submission is `ModelNew = Model` (the task's own module): an honest kernel whose true speedup
is 1. Each `--code DIR` is a checkout of kbverify (the default: this one); the checks alternate between them,
repeat by repeat, each in a fresh interpreter, so a before/after comparison shares the machine's load. Prints one
row per check (speedup, 95% interval, |log speedup|, the interval's half-width, rounds, whether the parent's clock
confirmed the worker's times, the clock used, the check's wall) and the median of each column per code and task.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TASKS = ("tasks/basic/level1/1_ReLU.py", "tasks/basic/level1/2_Square_matrix_multiplication_.py",
                 "tasks/basic/level1/3_Softmax.py")

# Run in a fresh interpreter with the checkout under test first on the path.
_ONE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from kbverify.core.protocols import VERIFIED
from kbverify.core.submissions import load_submission
from kbverify.core.tasks import load_task
from kbverify.harness.runner import CheckOptions, check
started = time.monotonic()
verdict = check(load_task(sys.argv[2]), load_submission(sys.argv[3]),
                VERIFIED.with_overrides(timing_budget_s=float(sys.argv[4])),
                CheckOptions(device=sys.argv[5], timeout_s=300.0))
timing = verdict.timing or {}
print(json.dumps({"status": verdict.status.value, "speedup": verdict.speedup, "ci": verdict.speedup_ci,
                  "rounds": len(timing.get("rounds") or []), "confirmed": timing.get("device_time_confirmed"),
                  "clock": timing.get("clock_used"), "warnings": list(verdict.warnings),
                  "wall_s": time.monotonic() - started}))
"""


def one(code: Path, task: str, submission: Path, budget_s: float, device: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _ONE, str(code), str(REPO / task), str(submission), str(budget_s),
                           device], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"status": "bench_error", "error": done.stderr.strip().splitlines()[-1:]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if row.get("speedup") and row.get("ci"):
        low, high = row["ci"]
        row["abs_log"] = abs(math.log(row["speedup"]))
        row["half_width"] = (math.log(high) - math.log(low)) / 2 if low and high else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", type=Path, help="a kbverify checkout (default: this one)")
    parser.add_argument("--task", action="append", help="a task file, relative to this checkout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=2.0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    codes, tasks = args.code or [REPO], args.task or list(DEFAULT_TASKS)
    submission = Path(tempfile.mkdtemp(prefix="kbv-aa-")) / "same_as_reference.py"
    submission.write_text("ModelNew = Model  # the task's own module: a true speedup of 1\n")
    rows = []
    for repeat in range(args.repeats):
        for task in tasks:
            for code in codes:
                row = {"code": str(code), "task": Path(task).stem, "repeat": repeat,
                       **one(code, task, submission, args.budget_s, args.device)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\nmedians per code and task: |log speedup|, half-width, rounds, wall s, confirmed share")
    for task in tasks:
        for code in codes:
            mine = [r for r in rows if r["code"] == str(code) and r["task"] == Path(task).stem and "abs_log" in r]
            if not mine:
                continue
            med = lambda key: statistics.median(r[key] for r in mine if r.get(key) is not None)
            confirmed = sum(1 for r in mine if r.get("confirmed")) / len(mine)
            print(f"{Path(task).stem:40s} {str(code):30s} {med('abs_log'):.4f} {med('half_width'):.4f} "
                  f"{med('rounds'):6.0f} {med('wall_s'):6.1f} {confirmed:.2f}")


if __name__ == "__main__":
    main()
