"""Repeatability of two stored runs of the same kernels (two `rescore` stores, same or other machine).

    python3 scripts/compare_runs.py STORE_A STORE_B [--protocol verified]

Prints one row per kernel correct in both runs (speedups, change, combined-CI test, speed classes), the kernels whose
status changed, and the summary: median |change|, the share within the combined CIs, and faster↔slower crossings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.repeatability import compare_runs  # noqa: E402
from kbverify.store import Store  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store_a", type=Path)
    parser.add_argument("store_b", type=Path)
    parser.add_argument("--protocol", default="verified")
    args = parser.parse_args()
    runs = []
    for path in (args.store_a, args.store_b):
        if not path.exists():
            print(f"{path}: no such store", file=sys.stderr)
            return 2
        with Store(path) as store:
            runs.append([verdict for _, verdict in store.verdicts()])
    result = compare_runs(*runs, protocol=args.protocol)
    print("| submission | speedup A | speedup B | change | within combined CI | class A | class B |")
    print("|---|---|---|---|---|---|---|")
    for k in result.kernels:
        print(f"| {k.submission} | {k.speedup_a:.3f} | {k.speedup_b:.3f} | {k.change:+.2%} | {k.within_combined_ci} | "
              f"{k.speed_class_a} | {k.speed_class_b} |")
    for submission, before, after in result.status_changed:
        print(f"status changed: {submission}: {before} -> {after}")
    if result.only_in_a or result.only_in_b:
        print(f"only in A: {len(result.only_in_a)}, only in B: {len(result.only_in_b)}")
    if not result.kernels:
        print("no kernel is correct and timed in both runs")
        return 1
    share = result.share_within_combined_ci
    print(f"{len(result.kernels)} kernels: median |change| {result.median_abs_change:.2%}; within the combined 95% CIs: "
          f"{'-' if share is None else f'{share:.0%}'}; faster<->slower crossings: {len(result.crossings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
