"""What one `kbverify check` costs per kernel, phase by phase, with native builds excluded.

    python3 bench/bench_check_cost.py [--pair TASK=SUBMISSION ...] [--corpus DIR] [--protocol verified]
        [--device cuda:0] [--budget-s S] [--json OUT]

Default pairs: every file of tests/gpu_corpus/honest (the task comes from its `# kbverify-test: task=...` header).
Native submissions are built first, in parallel, so the build cache is warm and no phase below includes a build.
Each check's worker phases (candidate, judge, timing, reference_timing, ...) are read from the runner's
"<job> child for <id>: <s> s" log records; the rest of the wall time (planning, hidden shapes, provenance) is
reported as "other". Prints one row per kernel and the median of each column.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kbverify.core.protocols import parse_protocols  # noqa: E402
from kbverify.core.submissions import Submission, load_submission  # noqa: E402
from kbverify.core.tasks import Task, load_task  # noqa: E402
from kbverify.harness.runner import CheckOptions, check  # noqa: E402
from kbverify.rescore.importers import Entry  # noqa: E402
from kbverify.rescore.rescore import prebuild  # noqa: E402

DEFAULT_CORPUS = REPO / "tests" / "gpu_corpus" / "honest"
_HEADER = re.compile(r"#\s*kbverify-test:.*\btask=(\S+)")
# The runner's "<job> child for <id>: <s> s (<timeline>)" record, read from its rendered text (here and in a
# rescore's stderr alike) rather than its format string, which grows details the table does not need.
_CHILD_LINE = re.compile(r"(\w+) child for (\S+): ([\d.]+) s\b")


class PhaseLog(logging.Handler):
    """Collects the runner's per-child wall times: (job, submission id, seconds)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.phases: list[tuple[str, str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = _CHILD_LINE.match(record.getMessage())
        if match:
            self.phases.append((match[1], match[2], float(match[3])))


def corpus_pairs(folder: Path) -> list[tuple[Path, Path]]:
    pairs = []
    for path in sorted(folder.glob("*.py")):
        head = "\n".join(path.read_text().splitlines()[:8])
        match = _HEADER.search(head)
        if match:
            pairs.append((REPO / match[1], path))
    return pairs


def parse_pair(text: str) -> tuple[Path, Path]:
    task, sep, submission = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected TASK=SUBMISSION, got {text!r}")
    return Path(task), Path(submission)


def warm_builds(pairs: list[tuple[Task, Submission]], options: CheckOptions) -> dict:
    entries = [Entry(entry_id=submission.id, task=task, submission=submission, level=task.level,
                     problem_id=task.problem_id, sample=0, claimed_speedup=None, unverifiable=None,
                     reference_origin="tasks_dir", modified_reference=None) for task, submission in pairs]
    return prebuild(entries, options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", action="append", type=parse_pair, default=[],
                        help="TASK=SUBMISSION (repeatable); default: the GPU corpus's honest kernels")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                        help="folder of headed submissions used when no --pair is given")
    parser.add_argument("--protocol", default="verified", help="one protocol name or file")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--budget-s", type=float, default=None, help="override the protocol's timing budget")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--store", type=Path, default=None,
                        help="read a finished `rescore -v` instead of running checks: its store ...")
    parser.add_argument("--rescore-log", type=Path, action="append", default=[],
                        help="... and the stderr of each of its calls (repeatable)")
    args = parser.parse_args(argv)
    if args.store:
        return from_rescore(args.store, args.rescore_log, args.protocol)

    pair_paths = args.pair or corpus_pairs(args.corpus)
    if not pair_paths:
        parser.error("no (task, submission) pairs: give --pair or a --corpus with headed files")
    protocols = parse_protocols(args.protocol)
    if len(protocols) != 1:
        parser.error("give one protocol")
    protocol = protocols[0]
    if args.budget_s is not None:
        protocol = protocol.with_overrides(timing_budget_s=args.budget_s)
    options = CheckOptions(device=args.device, timeout_s=args.timeout_s)
    pairs = [(load_task(task), load_submission(submission)) for task, submission in pair_paths]

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    handler = PhaseLog()
    runner_log = logging.getLogger("kbverify.harness.runner")
    runner_log.addHandler(handler)
    runner_log.setLevel(logging.INFO)

    started = time.monotonic()
    built = warm_builds(pairs, options)
    build_s = time.monotonic() - started
    failed = [sha for sha, result in built.items() if not result.get("ok")]
    print(f"warmed {len(built)} native builds in {build_s:.0f} s ({len(failed)} failed)", flush=True)

    rows = []
    for task, submission in pairs:
        handler.phases.clear()
        begin = time.monotonic()
        verdict = check(task, submission, protocol, options)
        wall_s = time.monotonic() - begin
        phases: dict[str, float] = {}
        for job, _, seconds in handler.phases:
            phases[job] = phases.get(job, 0.0) + seconds
        row = {"task": task.name, "submission": submission.id, "status": verdict.status.value,
               "wall_s": wall_s, "phases_s": phases, "other_s": wall_s - sum(phases.values()),
               "sets": len(verdict.sets), "speedup": verdict.speedup}
        rows.append(row)
        print(f"{submission.id}: {verdict.status.value}, {wall_s:.1f} s "
              + " ".join(f"{job}={seconds:.1f}" for job, seconds in phases.items()), flush=True)

    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"protocol": protocol.name, "device": args.device, "build_s": build_s,
                                         "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


_LOGGED_CHILD = re.compile(r"kbverify\.harness\.runner: " + _CHILD_LINE.pattern)


def from_rescore(store_path: Path, logs: list[Path], protocol: str) -> int:
    """The same table from a finished re-score: each verdict's wall time (builds were made before it) and the
    workers its protocol ran, from the runner's log lines. A resumed unit's workers appear in the log of the call
    that evaluated it; `kernelbench_*` workers belong to `original`, the others to the isolated protocols."""
    from kbverify.results.store import Store

    with Store(store_path) as store:
        verdicts = [v for _, v in store.verdicts() if v.protocol == protocol]
    phases: dict[str, dict[str, float]] = {}
    for log_path in logs:
        for line in log_path.read_text().splitlines():
            match = _LOGGED_CHILD.search(line)
            if not match:
                continue
            job, submission_id, seconds = match[1], match[2], float(match[3])
            if job.startswith("kernelbench") != (protocol == "original"):
                continue
            phases.setdefault(submission_id, {})
            phases[submission_id][job] = phases[submission_id].get(job, 0.0) + seconds
    rows = []
    for verdict in verdicts:
        jobs = phases.get(verdict.submission, {})
        rows.append({"task": verdict.task_name, "submission": verdict.submission, "status": verdict.status.value,
                     "wall_s": verdict.elapsed_s, "phases_s": jobs, "other_s": verdict.elapsed_s - sum(jobs.values()),
                     "sets": len(verdict.sets), "speedup": verdict.speedup})
    if not rows:
        print(f"{store_path}: no {protocol} verdicts")
        return 1
    print(f"{len(rows)} {protocol} verdicts from {store_path} (candidate and judge run side by side, so their "
          "sum exceeds the wall time and 'other' can be negative)")
    print_table(rows)
    return 0


def print_table(rows: list[dict]) -> None:
    jobs = list(dict.fromkeys(job for row in rows for job in row["phases_s"]))
    header = ["submission", "status", "sets", "wall s", *(f"{job} s" for job in jobs), "other s"]
    lines = [header]
    for row in rows:
        lines.append([row["submission"], row["status"], str(row["sets"]), f"{row['wall_s']:.1f}",
                      *(f"{row['phases_s'].get(job, 0.0):.1f}" for job in jobs), f"{row['other_s']:.1f}"])

    def median(values):
        return f"{statistics.median(values):.1f}" if values else "-"

    lines.append(["median", "", "", median([r["wall_s"] for r in rows]),
                  *(median([r["phases_s"][job] for r in rows if job in r["phases_s"]]) for job in jobs),
                  median([r["other_s"] for r in rows])])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print()
    for index, line in enumerate(lines):
        print("  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in
                        enumerate(zip(line, widths))))
        if index == 0 or index == len(lines) - 2:
            print("  ".join("-" * width for width in widths))


if __name__ == "__main__":
    sys.exit(main())
