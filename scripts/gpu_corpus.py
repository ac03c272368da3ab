"""The GPU corpus and the bundled GPU tasks as one command: every GPU call starts with it, so the GPU path never
drifts unseen.

    python3 scripts/gpu_corpus.py [--limit-s 300] [--out gpu_corpus.jsonl] [--only A,B] [--device cuda:0]

Cases: `tests/gpu_corpus/{honest,exploits,faults}` (headers as in tests/corpus), then each task of `tasks/gpu` with
its own `Model` as the submission (it must pass both protocols). Native submissions are built first, in parallel.
Prints one table row per case and protocol as it finishes (case, expected, got, speedup and interval, seconds),
appends each verdict to `--out` as a JSON line, and stops at its own time limit with what it finished: a case is
started only while the time left covers the slowest case so far. Exit 0 when every finished row matched its
header, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from corpus_cases import Case, read_case  # noqa: E402
from kbverify.core.protocols import ORIGINAL, VERIFIED  # noqa: E402
from kbverify.core.submissions import load_submission, make_submission  # noqa: E402
from kbverify.core.tasks import load_task  # noqa: E402
from kbverify.harness.runner import CheckOptions, check  # noqa: E402
from kbverify.judge.static import scan  # noqa: E402
from kbverify.judge.timing import driven_rounds  # noqa: E402
from kbverify.rescore.importers import Entry  # noqa: E402
from kbverify.rescore.rescore import prebuild  # noqa: E402

PROTOCOLS = {"original": ORIGINAL, "verified": VERIFIED.with_overrides(timing_budget_s=1.0)}
# Cases of the CPU corpus whose point is what a GPU does (cuDNN's nondeterminism, its clamp boundaries)
CPU_CASES = ("honest/conv_transpose_fused_clamp_at_the_boundary.py",)


def _cases(only: str) -> list[tuple[str, Case | None, Path, object]]:
    """(id, header or None for a task's own Model, task path, submission)."""
    out = []
    for folder in ("honest", "exploits"):
        paths = sorted((REPO / "tests" / "gpu_corpus" / folder).glob("*.py"))
        paths += [REPO / "tests" / "corpus" / name for name in CPU_CASES if name.startswith(folder + "/")]
        for path in paths:
            case = read_case(path)
            out.append((case.id, case, case.task, load_submission(path)))
    for path in sorted((REPO / "tasks" / "gpu").rglob("*.py")):
        source = path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
        out.append((f"task/{path.stem}", None, path, make_submission(source, id=f"{path.stem}_own_model.py")))
    for path in sorted((REPO / "tests" / "gpu_corpus" / "faults").glob("*.py")):  # last: a hang takes its budget
        case = read_case(path)
        out.append((case.id, case, case.task, load_submission(path)))
    wanted = [part for part in only.split(",") if part] or [""]
    return [item for item in out if any(part in item[0] for part in wanted)]


def _expected(case: Case | None, protocol: str) -> list[str]:
    return case.expect[protocol].split("|") if case is not None else ["passed"]


def _row(case_id: str, protocol: str, expected: list[str], verdict, seconds: float) -> dict:
    return {"case": case_id, "protocol": protocol, "expected": "|".join(expected), "status": verdict.status.value,
            "ok": verdict.status.value in expected, "speedup": verdict.speedup,
            "speedup_ci": list(verdict.speedup_ci) if verdict.speedup_ci else None,
            "warnings": list(verdict.warnings), "message": verdict.message[:300], "seconds": round(seconds, 1),
            "timing": _timing_summary(verdict.timing)}


def _timing_summary(timing: dict | None) -> dict | None:
    """What a timing verdict was made of, without the raw rounds, so a number that disagrees can be traced."""
    if not timing or "mode" not in timing:
        return None
    interleaved = timing.get("interleaved") or {}
    keep = ("mode", "mode_reason", "blocked", "clock_used", "device_time_confirmed", "unexplained_ms", "clocks",
            "noise_margin")
    return {**{key: timing.get(key) for key in keep},
            **{key: interleaved.get(key) for key in ("phase_ms_per_call", "cover_ms", "uncovered_calls", "host_ms")},
            "rounds": len(driven_rounds(timing)),
            "clean_rounds": len((timing.get("clean_reference") or {}).get("rounds") or []),
            "timed_outputs_checked": (timing.get("timed_outputs") or {}).get("checked")}


def _print(row: dict) -> None:
    speed = "" if row["speedup"] is None else f"{row['speedup']:.3f}x"
    if row["speedup_ci"]:
        speed += f" [{row['speedup_ci'][0]:.3f}, {row['speedup_ci'][1]:.3f}]"
    mark = "ok " if row["ok"] else "BAD"
    print(f"{mark} {row['case'][:58]:58} {row['protocol']:8} {row['expected'][:30]:30} {row['status']:24} "
          f"{speed:28} {row['seconds']:6.1f}s", flush=True)
    if not row["ok"]:
        print(f"    {row['message'][:200]}  warnings: {','.join(row['warnings'])}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default="", help="comma-separated substrings of case ids")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    started = time.monotonic()
    options = CheckOptions(device=args.device, timeout_s=120.0)  # a hang is a timeout well within this
    cases = _cases(args.only)
    native = [(cid, task, sub) for cid, case, task, sub in cases
              if scan(sub.source).native_sources and "faults/" not in cid]  # a hang's build forward would spin
    built = prebuild([Entry(entry_id=cid, task=load_task(task), submission=sub, level=None, problem_id=None, sample=0,
                            claimed_speedup=None, unverifiable=None, reference_origin="tasks_dir",
                            modified_reference=None) for cid, task, sub in native],
                     options, workers=min(len(native), os.cpu_count() or 1)) if native else {}
    print(f"built {sum(1 for b in built.values() if b.get('ok'))} of {len(native)} native submissions in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    rows, slowest = [], 0.0
    for case_id, case, task_path, submission in cases:
        left = args.limit_s - (time.monotonic() - started)
        if left < slowest:
            print(f"stopped at the time limit: {len(rows)} rows, {left:.0f} s left, slowest case {slowest:.0f} s")
            break
        case_started = time.monotonic()
        for name, protocol in PROTOCOLS.items():
            if case is not None and name not in case.expect:
                continue  # a protocol its header does not name (a hang's `original` would hold the GPU past it)
            one = time.monotonic()
            verdict = check(load_task(task_path), submission, protocol, options)
            row = _row(case_id, name, _expected(case, name), verdict, time.monotonic() - one)
            rows.append(row)
            _print(row)
            if args.out:
                with args.out.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
        slowest = max(slowest, time.monotonic() - case_started)
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} rows as expected; {len(bad)} not; "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
