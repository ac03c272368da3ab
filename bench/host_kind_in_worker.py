"""What the timing worker itself measures in each kind of batch, for one task and submission: the companion of
`host_kind_factors.py`, which times KernelBench's loop with the host kind's steps added in a plain process.

    python3 bench/host_kind_in_worker.py TASK.py SUBMISSION.py [--budget-s 3] [--repeats 2]

Runs the `timing` worker (sandboxed as `check` runs it; `KBVERIFY_SANDBOX=off` in the environment runs it
unconfined) and prints, per kind of batch: the median event time per call of each side, the paired speedup and
its interval, and the worker's own host time per call by phase. Where the host kind's candidate time is far above
KernelBench's loop's, the phases say where the host spent it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.core import stats  # noqa: E402
from kbverify.core.inputs import new_run_secret  # noqa: E402
from kbverify.core.tasks import load_task  # noqa: E402
from kbverify.timing import timing_control  # noqa: E402


# The reference made to wait on the device inside its forward, as a blocked candidate does: what the harness's work
# after a blocked call costs, with no submission code.
BLOCKED_COPY_SOURCE = """
class ModelNew(Model):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        torch.cuda.synchronize()
        return out
"""


def measure(task_path: str, submission_path: str, budget_s: float, device: str, lead_call: bool = True) -> dict:
    task = load_task(Path(task_path))
    payload = {"task_source": task.source, "task_name": task.name,
               "submission_source": (BLOCKED_COPY_SOURCE if submission_path == "blocked-copy"
                                     else Path(submission_path).read_text()), "device": device,
               "secret": new_run_secret(), "budget_s": budget_s, "ci_half_width": 0.005, "train_mode": True,
               "baseline_matmul_tf32": True, "baseline_cudnn_tf32": True, "candidate_grad_enabled": False,
               "host_lead_call": lead_call}
    workers = {"ref": ("reference_timing", {**payload, "submission_source": ""}), "cand": ("timing", payload)}
    outcomes, driven = timing_control.run(workers, timeout_s=300.0, device=device, budget_s=budget_s,
                                          target_half_width=0.005, check=False)
    record = outcomes["cand"].result or {}
    out: dict = {"rounds": len(driven.rounds), "phase_ms_per_call": record.get("phase_ms_per_call"),
                 "cover_ms": record.get("cover_ms"), "error": record.get("error")}
    for kind in timing_control.KINDS:
        paired = timing_control.paired_rounds(driven.rounds, kind)
        if not paired:
            continue
        estimate = stats.paired_speedup(paired)
        out[kind] = {"unexplained_d_ms": _unexplained_difference(driven.rounds, kind),
                     "ref_ms": statistics.median(t for r in paired for t in r[0]),
                     "cand_ms": statistics.median(t for r in paired for t in r[1]),
                     "speedup": estimate.speedup, "ci": [estimate.ci_low, estimate.ci_high]}
    return out


def _unexplained_difference(rounds: list, kind: str) -> float | None:
    """Median over rounds of what the candidate's batch of this kind left unexplained per call (the parent's wall
    less the worker's times) minus the reference's: kbverify.judge.confirmation.device_time_confirmed's d, by kind."""
    differences = []
    for r in rounds:
        per_side = []
        for side in ("ref", "cand"):
            times = r.get(timing_control.side_key(side, kind))
            wall = r.get(timing_control.side_key(side, kind, "wall_ms"))
            per_side.append((wall - sum(times)) / len(times) if times and wall is not None else None)
        if None not in per_side:
            differences.append(per_side[1] - per_side[0])
    return statistics.median(differences) if differences else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task")
    parser.add_argument("submission", help="a file, or `blocked-copy` for the reference with a synchronise inside")
    parser.add_argument("--budget-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--no-lead", action="store_true", help="no untimed call before each host-kind batch")
    args = parser.parse_args(argv)
    for repeat in range(args.repeats):
        result = measure(args.task, args.submission, args.budget_s, args.device, lead_call=not args.no_lead)
        for kind in timing_control.KINDS:
            if kind in result:
                k = result[kind]
                print(f"run {repeat + 1} {kind:>6}: ref {k['ref_ms']:.4f} ms  cand {k['cand_ms']:.4f} ms  "
                      f"speedup {k['speedup']:.3f} [{k['ci'][0]:.3f}, {k['ci'][1]:.3f}]  d {k['unexplained_d_ms']:.4f} ms  "
                      f"({result['rounds']} rounds)")
        print(f"run {repeat + 1} phases (ms per call): {json.dumps(result['phase_ms_per_call'])}")
        if result.get("error"):
            print(f"run {repeat + 1} error: {result['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
