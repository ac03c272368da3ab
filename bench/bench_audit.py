"""What the audit costs: the same tasks audited twice, one after the other on this machine, and compared.

    python3 bench/bench_audit.py TASKS_DIR [--device cpu] [--against REV] [--hidden] [--seeds 3] [--json OUT]

With --against REV, the code at git revision REV (a temporary `git archive` of it) and the working tree each
audit the tasks in a process of their own; without it, the working tree audits them with the bf16/fp16 null
kernels on every seed and on the first seed only (`AuditSettings.low_precision_seeds`).
Prints each task's worker seconds under both, the total ratio, and whether the two audits agree on every task's
flags, degeneracy, error and evidence (worker timings aside, and without --against the bf16/fp16 passes, which
fewer seeds may change). Hidden shapes are off unless --hidden: a task copied and shrunk for the CPU has no
committed manifest, and generating shapes would time the generator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = ["original", "kbv", "verified"]
VOLATILE_EVIDENCE = ("phase_s", "timing", "timing_degenerate")  # measured times, not verdicts
LOW_PRECISION = ("trivially_passable:bf16:", "trivially_passable:fp16:")  # fewer seeds may change these only

# Run in a child whose sys.path starts with the code under test; only the audit's stable API is used, so the
# same program runs against older revisions.
_CHILD = """
import json, sys, tempfile
from pathlib import Path
from kbverify.audit import AuditSettings, audit_tasks
from kbverify.core.tasks import load_task_dir
args = json.loads(sys.argv[1])
folders = sorted(p for p in Path(args["tasks"]).glob("level*") if p.is_dir()) or [Path(args["tasks"])]
tasks = [task for folder in folders for task in load_task_dir(folder)]
settings = AuditSettings(seeds=args["seeds"], hidden_shapes=args["hidden"], **args["extra"])
with tempfile.TemporaryDirectory() as work:
    report = audit_tasks(tasks, protocols=args["protocols"], device=args["device"], out_prefix=Path(work) / "bench",
                         resume=False, settings=settings)
json.dump({a.task: {"wall_s": a.wall_s, "flags": list(a.flags), "degenerate_under": list(a.degenerate_under),
                    "error": a.error, "evidence": a.evidence} for a in report.tasks},
          open(args["out"], "w"), default=str)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", type=Path, help="a folder of task files, or one holding level1/, level2/, ...")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--against", metavar="REV", help="compare the working tree with the code at this revision")
    parser.add_argument("--hidden", action="store_true", help="audit hidden shapes too")
    parser.add_argument("--seeds", type=int, default=3, help="the input seeds of the original shape")
    parser.add_argument("--json", type=Path, help="also write both audits' per-task results here")
    args = parser.parse_args()
    common = {"tasks": str(args.tasks.resolve()), "device": args.device, "seeds": args.seeds, "hidden": args.hidden,
              "protocols": PROTOCOLS}
    with tempfile.TemporaryDirectory() as work:
        if args.against:
            old_tree = Path(work) / "old"
            _export(args.against, old_tree)
            labels = (f"at {args.against}", "working tree")
            runs = [(old_tree, {}), (REPO, {})]
        else:
            labels = ("bf16/fp16 on every seed", "on the first seed")
            runs = [(REPO, {"low_precision_seeds": args.seeds}), (REPO, {"low_precision_seeds": 1})]
        results = [_audit(tree, {**common, "extra": extra}, Path(work) / f"run{index}.json")
                   for index, (tree, extra) in enumerate(runs)]
    if args.json:
        args.json.write_text(json.dumps(dict(zip(labels, results)), indent=1, default=str))
    print(_table(args, labels, *results, ignored=() if args.against else LOW_PRECISION))


def _export(revision: str, target: Path) -> None:
    """The tracked files at `revision` (no work tree of git's own, nothing left behind)."""
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)


def _audit(tree: Path, args: dict, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", _CHILD, json.dumps({**args, "out": str(out)})], cwd=tree, env=env,
                   check=True)
    return json.loads(out.read_text())


def _table(args, labels: tuple[str, str], first: dict, second: dict, ignored: tuple[str, ...]) -> str:
    """`ignored`: flag prefixes (and their evidence) the two audits may legitimately disagree on."""
    lines = [f"{len(first)} tasks in {args.tasks}, device {args.device}, hidden shapes {'on' if args.hidden else 'off'}",
             f"| task | worker s, {labels[0]} | {labels[1]} | ratio | flags, degeneracy, errors | evidence |",
             "|---|---|---|---|---|---|"]
    same_verdicts = same_evidence = True
    for name in first:
        a, b = first[name], second.get(name, {})
        verdicts = (_kept(a.get("flags", ()), ignored) == _kept(b.get("flags", ()), ignored)
                    and all(a.get(k) == b.get(k) for k in ("degenerate_under", "error")))
        evidence = _stable(a.get("evidence", {}), ignored) == _stable(b.get("evidence", {}), ignored)
        # a stochastic reference's numbers differ from run to run whatever the code
        stochastic = "stochastic" in a.get("flags", ())
        same_verdicts &= verdicts
        same_evidence &= evidence or stochastic
        ratio = a["wall_s"] / b["wall_s"] if b.get("wall_s") else float("nan")
        evidence_cell = "same" if evidence else "differs (stochastic reference)" if stochastic else "DIFFERS"
        lines.append(f"| {name} | {a['wall_s']:.2f} | {b.get('wall_s', float('nan')):.2f} | {ratio:.2f}x | "
                     f"{'same' if verdicts else 'DIFFER'} | {evidence_cell} |")
    total_first = sum(a["wall_s"] for a in first.values())
    total_second = sum(b["wall_s"] for b in second.values())
    lines.append(f"total: {total_first:.1f} s vs {total_second:.1f} s = {total_first / total_second:.2f}x; "
                 f"flags, degeneracy and errors {'identical' if same_verdicts else 'DIFFER'}; "
                 f"evidence {'identical' if same_evidence else 'DIFFERS'} (stochastic references aside)")
    return "\n".join(lines)


def _kept(flags, ignored: tuple[str, ...]) -> list:
    return [flag for flag in flags if not flag.startswith(ignored)]  # startswith(()) is False


def _stable(evidence: dict, ignored: tuple[str, ...]) -> str:
    kept = {k: v for k, v in evidence.items() if k not in VOLATILE_EVIDENCE and not k.startswith(ignored)}
    return json.dumps(kept, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
