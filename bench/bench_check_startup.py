"""What one `kbverify check` costs a caller on this machine, against the floor every such process pays.

    python3 bench/bench_check_startup.py [--against REV ...] [--repeats 6] [--device cpu]

Runs `python3 -m kbverify check SUB --task TASK --protocol original --json` as a caller that reads its output
would (`subprocess.run(capture_output=True)`: it waits until every process holding the pipes has let go), beside
`python3 -c "import torch"`, the floor of any torch process (KernelBench's eval pays it too), alternating, and
prints each tree's median wall and its ratio to that floor. With --against, the code at each git revision (a
temporary `git archive`) runs as well, so a change's effect is measured in one run on one machine. The kernel is
a small honest CPU one from the corpus: the cost measured is start-up and teardown, not the kernel's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_audit import _export  # noqa: E402  (the tracked files at a revision, in a temporary folder)

SUBMISSION = REPO / "tests" / "corpus" / "honest" / "batchnorm_two_pass.py"
TASK = REPO / "tasks" / "basic" / "level1" / "13_Batch_Norm.py"


def _wall(command: list[str], cwd: Path, tree: Path | None) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else dict(os.environ)
    started = time.perf_counter()
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - started
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {cwd}: {run.stderr[-500:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", action="append", default=[], help="a git revision to measure as well")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    check = ["-m", "kbverify", "check", str(SUBMISSION), "--task", str(TASK), "--protocol", "original",
             "--device", args.device, "--json"]
    with tempfile.TemporaryDirectory() as work:
        trees = {}
        for revision in args.against:
            trees[f"at {revision}"] = Path(work) / revision.replace("/", "_")
            _export(revision, trees[f"at {revision}"])
        trees["working tree"] = REPO
        walls = {name: [] for name in trees}
        floor = []
        for _ in range(args.repeats):
            for name, tree in trees.items():
                walls[name].append(_wall([sys.executable, *check], tree, tree))
            floor.append(_wall([sys.executable, "-c", "import torch"], REPO, None))
    base = statistics.median(floor)
    print(f"python3 -c 'import torch': median {base:.2f} s over {args.repeats} runs")
    for name, values in walls.items():
        median = statistics.median(values)
        print(f"kbverify check, {name}: median {median:.2f} s, {median / base:.2f}x the floor "
              f"(min {min(values):.2f}, max {max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
