"""What the sandbox costs: `check --protocol verified` wall time with isolation against without it.

    python3 bench/bench_isolation_cost.py CORPUS.jsonl --select SUBSET.json [--count N] [--device cuda:0]

For each of the first N verifiable kernels of the selection: one untimed check first (it builds the kernel's
extension, which both measured checks then load from the cache), then one check with the sandbox (the default)
and one with `KBVERIFY_SANDBOX=off`, in alternating order per kernel. Prints each kernel's two walls and statuses,
and the median ratio isolated / unconfined.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kbverify.cli import jobs  # noqa: E402
from kbverify.core import protocols  # noqa: E402
from kbverify.harness import runner  # noqa: E402
from kbverify.rescore import importers  # noqa: E402


def _check(entry, protocol, device: str, sandboxed: bool):
    os.environ["KBVERIFY_SANDBOX"] = "on" if sandboxed else "off"
    started = time.monotonic()
    verdict = runner.check(entry.task, entry.submission, protocol, runner.CheckOptions(device=device, timeout_s=300))
    return time.monotonic() - started, verdict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--select", type=Path, required=True)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    entries = [e for e in jobs.select_entries(importers.load_entries(args.corpus), args.select) if e.verifiable]
    protocol = protocols.get_protocol("verified")
    ratios = []
    print("kernel | isolated s | unconfined s | ratio | statuses | isolation")
    for index, entry in enumerate(entries[: args.count]):
        order = [True, False] if index % 2 == 0 else [False, True]
        _check(entry, protocol, args.device, True)  # builds what the kernel builds; not measured
        walls, verdicts = {}, {}
        for sandboxed in order:
            walls[sandboxed], verdicts[sandboxed] = _check(entry, protocol, args.device, sandboxed)
        ratio = walls[True] / walls[False]
        ratios.append(ratio)
        print(f"{entry.entry_id} | {walls[True]:.2f} | {walls[False]:.2f} | {ratio:.3f} | "
              f"{verdicts[True].status.value}/{verdicts[False].status.value} | "
              f"{verdicts[True].isolation}/{verdicts[False].isolation}", flush=True)
    if ratios:
        print(f"median isolated/unconfined over {len(ratios)} kernels: {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
