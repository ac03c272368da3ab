"""Parity of `kbverify check --protocol original` with KernelBench v0.1's own eval, both on one GPU, in one run.

Needs a local copy of KernelBench v0.1's `src/` (given with --kb; this script downloads nothing) and the CUDA-L1
corpus with its anchor subset. For every kernel, alternately KernelBench first or kbverify first:
  KernelBench: a fresh process times the reference with `measure_program_time` (its baseline script, before any
  custom code, not counted in its cost), then a second fresh process runs `eval_kernel_against_ref(seed 42,
  5 trials, 100 perf trials)`, as KernelBench runs them (--kb-baseline same-process: both in one process);
  kbverify: `python3 -m kbverify check SUB --task REF --protocol original --device cuda --json` in a fresh process.
Builds are made beforehand for both (construct + one forward, since many kernels build lazily) and excluded.
Writes parity.jsonl and parity.md to --out and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# KernelBench's side is assembled from three parts: the process's start (imports, CUDA), the baseline (its
# scripts/generate_baseline_time.py), and the eval. KernelBench itself times the baseline in a run of its own and
# reads it back from a JSON; with --kb-baseline separate (the default) so does this script, so the eval process is
# what a caller of KernelBench pays per kernel: a fresh process and eval_kernel_against_ref, which brings up
# cuBLAS/cuDNN and loads the reference's kernels itself. --kb-baseline same-process runs the baseline first in the
# eval's process (how records without `kb_baseline` were measured), which leaves those warm for the eval and
# outside the cost.
KB_PRELUDE = r'''
import json, sys, time, os
started = float(sys.argv[5])
sys.path.insert(0, sys.argv[1])
from src import eval as kb_eval
import torch
imported = time.time()
ref = open(sys.argv[2]).read(); custom = open(sys.argv[3]).read()
device = torch.device("cuda:0")
# A real KernelBench eval brings up CUDA inside eval_kernel_against_ref; here it is brought up first, so its
# cost is measured on its own and counted with KernelBench's.
torch.zeros(1, device=device); torch.cuda.synchronize(device=device)
cuda_ready = time.time()
baseline = None
'''

KB_BASELINE = r'''
# The reference in a process before any custom code (so no flag it sets can leak into it): measure_program_time
# from KernelBench's scripts/generate_baseline_time.py (v0.1), eager, default flags.
context = {}
Model, get_init_inputs, get_inputs = kb_eval.load_original_model_and_inputs(ref, context)
with torch.no_grad():
    torch.cuda.synchronize(device=device)
    kb_eval.set_seed(42); inputs = get_inputs()
    kb_eval.set_seed(42); init_inputs = get_init_inputs()
    inputs = [x.cuda(device=device) if isinstance(x, torch.Tensor) else x for x in inputs]
    init_inputs = [x.cuda(device=device) if isinstance(x, torch.Tensor) else x for x in init_inputs]
    model = Model(*init_inputs).cuda(device=device)
    torch.cuda.synchronize(device=device)
    times = kb_eval.time_execution_with_cuda_event(model, *inputs, num_trials=100, verbose=False, device=device)
baseline = kb_eval.get_timing_stats(times, device=device)
del model, inputs, init_inputs, context
torch.cuda.empty_cache()
'''

KB_EVAL_TAIL = r'''
eval_started = time.time()
result = kb_eval.eval_kernel_against_ref(ref, custom, seed_num=42, num_correct_trials=5, num_perf_trials=100,
                                         measure_performance=True, build_dir=sys.argv[4], device=device)
out = {"import_s": imported - started, "cuda_init_s": cuda_ready - imported, "eval_s": time.time() - eval_started,
       "baseline_s": eval_started - cuda_ready, "baseline": baseline}
if result is None:
    out["retry"] = True
else:
    out.update(compiled=result.compiled, correctness=result.correctness, runtime=result.runtime,
               metadata={k: str(v)[:300] for k, v in result.metadata.items()})
print("KBRESULT " + json.dumps(out))
'''

KB_BASELINE_TAIL = r'''
out = {"import_s": imported - started, "cuda_init_s": cuda_ready - imported, "baseline_s": time.time() - cuda_ready,
       "baseline": baseline}
print("KBRESULT " + json.dumps(out))
'''

KB_SCRIPTS = {"same-process": KB_PRELUDE + KB_BASELINE + KB_EVAL_TAIL, "eval": KB_PRELUDE + KB_EVAL_TAIL,
              "baseline": KB_PRELUDE + KB_BASELINE + KB_BASELINE_TAIL}

KB_PREBUILD = r'''
import sys, os
sys.path.insert(0, sys.argv[1])
import torch
from src.eval import load_original_model_and_inputs, load_custom_model, set_seed
ref = open(sys.argv[2]).read(); custom = open(sys.argv[3]).read()
context = {}
Model, get_init_inputs, get_inputs = load_original_model_and_inputs(ref, context)
ModelNew = load_custom_model(custom, context, sys.argv[4])
set_seed(42)
model = ModelNew(*[x.cuda() if isinstance(x, torch.Tensor) else x for x in get_init_inputs()]).cuda()
with torch.no_grad():
    model(*[x.cuda() if isinstance(x, torch.Tensor) else x for x in get_inputs()])
torch.cuda.synchronize()
'''


def _kb_result(stdout: str) -> dict | None:
    for line in stdout.splitlines():
        if line.startswith("KBRESULT "):
            return json.loads(line[len("KBRESULT "):])
    return None


def load_kernels(corpus: Path, subset: Path, limit: int, extra: Path | None, repo: Path) -> list[dict]:
    wanted = [(k["level_id"], k["task_id"]) for k in json.loads(subset.read_text())["kernels"]][:limit]
    rows = {}
    for line in corpus.read_text().splitlines():
        row = json.loads(line)
        rows[(row["level_id"], row["task_id"])] = row
    kernels = [{"id": f"cuda-l1/level{lv}/{tid}", "ref": rows[(lv, tid)]["ref_code"],
                "custom": rows[(lv, tid)]["custom_code"], "claimed": rows[(lv, tid)].get("score_default")}
               for lv, tid in wanted]
    if extra is not None:
        for path in sorted(extra.glob("*.py")):
            header = path.read_text().splitlines()[0]
            task = header.split("task=", 1)[1].strip()
            kernels.append({"id": f"own/{path.stem}", "ref": (repo / task).read_text(), "custom": path.read_text(),
                            "claimed": None})
    return kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=Path, help="folder holding KernelBench v0.1's src/")
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--subset", type=Path)
    parser.add_argument("--extra", type=Path, default=None, help="folder of own CUDA kernels (tests/gpu_corpus/honest)")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=Path(".device/parity"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table-from", type=Path, nargs="+", default=None,
                        help="print the table and summary of earlier runs' parity.jsonl files; run nothing")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side per kernel, alternating")
    parser.add_argument("--prebuild-only", action="store_true", help="build every kernel for both sides and stop")
    parser.add_argument("--kb-baseline", choices=("separate", "same-process"), default="separate",
                        help="where KernelBench's baseline is timed: a process of its own, as KernelBench does "
                             "(default), or first in the eval's process (how records without kb_baseline were "
                             "measured)")
    parser.add_argument("--kb-from", type=int, default=0,
                        help="run KernelBench only from this kernel index on (earlier ones were measured already)")
    args = parser.parse_args()
    if args.table_from:
        records = latest_records(_records(path) for path in args.table_from)
        print("\n".join(_row(record) for record in records))
        print(_summary(records))
        return
    if not (args.kb and args.corpus and args.subset and args.out):
        parser.error("--kb, --corpus, --subset and --out are needed to run (or --table-from to report)")
    repo = Path(__file__).resolve().parent.parent
    kernels = load_kernels(args.corpus, args.subset, args.limit, args.extra, repo)
    for index, kernel in enumerate(kernels):
        kernel["run_kb"] = index >= args.kb_from
    kernels = kernels[args.start:args.start + args.count]
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{repo}:{os.environ.get('PYTHONPATH', '')}",
           "KBVERIFY_CACHE": os.environ.get("KBVERIFY_CACHE") or str((args.work / "kbverify-cache").resolve())}
    for kernel in kernels:
        folder = args.work / kernel["id"].replace("/", "_")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ref.py").write_text(kernel["ref"])
        (folder / "custom.py").write_text(kernel["custom"])
        kernel["folder"] = folder.resolve()

    def prebuild(kernel):
        folder = kernel["folder"]
        started = time.time()
        if kernel["run_kb"] and not (folder / "kb.built").exists():
            subprocess.run([sys.executable, "-c", KB_PREBUILD, str(args.kb.resolve()), str(folder / "ref.py"),
                            str(folder / "custom.py"), str(folder / "kb_build")], env=env, capture_output=True,
                           timeout=600)
            (folder / "kb.built").write_text("")
        if not (folder / "kbv.built").exists():
            code = ("import sys; from kbverify.rescore.rescore import prebuild; from kbverify.rescore.importers import Entry;"
                    "from kbverify.core.tasks import parse_task; from kbverify.core.submissions import make_submission;"
                    "from kbverify.harness.runner import CheckOptions;"
                    "t=parse_task(open(sys.argv[1]).read(), name='ref'); s=make_submission(open(sys.argv[2]).read(), id='custom.py');"
                    "e=Entry('x', t, s, None, None, 0, None, None, 'jsonl', None);"
                    "print(prebuild([e], CheckOptions(device='cuda:0'), workers=1))")
            subprocess.run([sys.executable, "-c", code, str(folder / "ref.py"), str(folder / "custom.py")], env=env,
                           capture_output=True, timeout=900)
            (folder / "kbv.built").write_text("")
        return time.time() - started

    started = time.time()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(prebuild, kernels))
    print(f"prebuild: {len(kernels)} kernels in {time.time() - started:.0f} s", flush=True)
    if args.prebuild_only:
        return

    # A cut run resumes: the kernels already in the output file are reported from it, not run again.
    finished = {}
    if (args.out / "parity.jsonl").exists():
        for record in _records(args.out / "parity.jsonl"):
            finished[record["id"]] = record
    results = []
    for index, kernel in enumerate(kernels):
        if kernel["id"] in finished:
            results.append(finished[kernel["id"]])
            print(_row(finished[kernel["id"]]) + " (resumed)", flush=True)
            continue
        folder = kernel["folder"]
        pair = ["kb", "kbverify"] if index % 2 == 0 else ["kbverify", "kb"]
        order = pair * args.repeats
        record = {"id": kernel["id"], "claimed": kernel["claimed"], "order": order, "kb_runs": [], "kbverify_runs": []}
        for side in order:
            if side == "kb" and kernel["run_kb"]:
                record["kb_runs"].append(_run_kb(args, env, folder))
            elif side == "kbverify":
                record["kbverify_runs"].append(_run_kbverify(args, env, folder))
        record.update(_compare(record))
        results.append(record)
        with open(args.out / "parity.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(_row(record), flush=True)
    print(_summary(results))


def latest_records(files) -> list[dict]:
    """One record per kernel: where a kernel was run again in a later file, the later record (the code being
    measured) replaces the earlier one, in the earlier one's place, unless it lacks one side (a run with
    --kb-from measured kbverify alone): both sides of a record come from one run on one machine."""
    by_id: dict[str, dict] = {}
    for records in files:
        for record in records:
            complete = bool(record.get("kb_runs")) and bool(record.get("kbverify_runs"))
            if complete or record["id"] not in by_id:
                by_id[record["id"]] = record
    return list(by_id.values())


def _records(path: Path) -> list[dict]:
    """The kernels a run finished; a last line cut off mid-write (the run was killed) is not one of them."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _run_kb(args, env: dict, folder: Path) -> dict:
    if args.kb_baseline == "same-process":
        result = _kb_process(args, env, folder, "same-process")
    else:
        # KernelBench's workflow: the baseline in a run of its own (read back from a JSON), then the eval in a
        # fresh process
        timed = _kb_process(args, env, folder, "baseline")
        result = _kb_process(args, env, folder, "eval")
        result.update(baseline=timed.get("baseline"), baseline_s=timed.get("baseline_s", 0.0),
                      baseline_process_s=timed.get("process_s"))
    result["kb_baseline"] = args.kb_baseline
    # KernelBench's cost as a caller pays it: process start and imports, CUDA's start, eval_kernel_against_ref.
    # Not the baseline, which KernelBench reads from a JSON. `baseline_s` (its timed part, without a process start)
    # is kept so the cost with a live baseline (what kbverify pays) can be shown beside it.
    result["process_s"] = sum(result.get(key, 0) for key in ("import_s", "cuda_init_s", "eval_s"))
    correct = bool(result.get("compiled") and result.get("correctness"))
    baseline = result.get("baseline") or {}
    result["speedup"] = (baseline["mean"] / result["runtime"]
                         if correct and result.get("runtime", -1) > 0 and baseline.get("mean") else None)
    return result


def _kb_process(args, env: dict, folder: Path, script: str) -> dict:
    _clear_stale_build_locks(folder / "kb_build")
    t0 = time.time()
    try:
        run = subprocess.run([sys.executable, "-c", KB_SCRIPTS[script], str(args.kb.resolve()),
                              str(folder / "ref.py"), str(folder / "custom.py"), str(folder / "kb_build"), str(t0)],
                             env=env, capture_output=True, text=True, timeout=args.timeout)
        result = _kb_result(run.stdout) or {"error": run.stderr[-500:]}
    except subprocess.TimeoutExpired:
        result = {"error": f"KernelBench's process ran past {args.timeout} s"}
    result["process_s"] = time.time() - t0
    return result


def _clear_stale_build_locks(build_dir: Path) -> None:
    """torch's extension builder holds `lock` in the build folder while it compiles and waits forever on one it
    finds. Rows run one at a time, so a lock present before a run was left by a run that was killed mid-build
    (a cut call); left in place it hangs every later KernelBench run of that kernel."""
    for lock in build_dir.glob("**/lock"):
        lock.unlink(missing_ok=True)


def _run_kbverify(args, env: dict, folder: Path) -> dict:
    t0 = time.time()
    run = subprocess.run([sys.executable, "-m", "kbverify", "check", str(folder / "custom.py"), "--task",
                          str(folder / "ref.py"), "--protocol", "original", "--device", "cuda",
                          "--json", "--timeout", str(args.timeout), "-v"], env=env, capture_output=True,
                         text=True, timeout=args.timeout * 3)
    process_s = time.time() - t0
    try:
        verdict = json.loads(run.stdout.strip().splitlines()[-1])["verdicts"]["original"]
    except (IndexError, json.JSONDecodeError, KeyError):
        verdict = {"error": (run.stderr or run.stdout)[-800:]}
    verdict["process_s"] = process_s
    verdict["log_tail"] = run.stderr[-1500:]
    return verdict


def _spread(values: list[float]) -> float | None:
    """A side's own run-to-run change on this kernel: (max − min) / min over its repeated runs."""
    values = [v for v in values if v]
    return (max(values) - min(values)) / min(values) if len(values) > 1 else None


def _compare(record: dict) -> dict:
    kb_runs, kv_runs = record["kb_runs"], record["kbverify_runs"]
    kb, kv = (kb_runs[0] if kb_runs else {}), (kv_runs[0] if kv_runs else {})
    kb_correct = bool(kb.get("compiled") and kb.get("correctness"))
    kv_correct = kv.get("status") == "passed"
    kb_speedups = [r["speedup"] for r in kb_runs if r.get("speedup")]
    kv_speedups = [r["speedup"] for r in kv_runs if r.get("speedup")]
    kb_speedup = statistics.median(kb_speedups) if kb_speedups else None
    kv_speedup = statistics.median(kv_speedups) if kv_speedups else None
    spreads = [x for x in (_spread(kb_speedups), _spread(kv_speedups)) if x is not None]
    spread = max(spreads) if spreads else None
    change = abs(kv_speedup / kb_speedup - 1) if kb_speedup and kv_speedup else None
    kb_cost = statistics.median(r["process_s"] for r in kb_runs) if kb_runs else None
    kv_cost = statistics.median(r["process_s"] for r in kv_runs) if kv_runs else None
    return {"kb_compiled": bool(kb.get("compiled")), "kb_correct": kb_correct,
            "kbverify_compiled": kv.get("status") not in (None, "compile_error"), "kbverify_correct": kv_correct,
            "verdicts_agree": all(
                bool(k.get("compiled") and k.get("correctness")) == kb_correct for k in kb_runs) and all(
                (v.get("status") == "passed") == kv_correct for v in kv_runs) and kb_correct == kv_correct
            and bool(kb.get("compiled")) == (kv.get("status") != "compile_error"),
            "kb_speedup": kb_speedup, "kbverify_speedup": kv_speedup, "speedup_change": change,
            "measured_spread": spread,
            "within_spread": (change <= spread) if change is not None and spread is not None else None,
            "kb_process_s": kb_cost, "kbverify_process_s": kv_cost,
            "cost_ratio": kv_cost / kb_cost if kb_cost and kv_cost else None}


def _row(r: dict) -> str:
    kv = (r.get("kbverify_runs") or [{}])[0]
    build = kv.get("build") or {}
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    return (f"| {r['id']} | {r['kb_compiled']}/{r['kb_correct']} | {kv.get('status')} | {fmt(r['kb_speedup'])} | "
            f"{fmt(r['kbverify_speedup'])} | {fmt(r['speedup_change'])} | {fmt(r['measured_spread'])} | "
            f"{build.get('native_sources')}/{build.get('extension_built')}/{build.get('extension_called')} | "
            f"{fmt(r['kb_process_s'])} | {fmt(r['kbverify_process_s'])} |")


def _summary(results: list[dict]) -> str:
    agree = sum(r["verdicts_agree"] for r in results)
    ratios = [r["kbverify_speedup"] / r["kb_speedup"] for r in results if r["kb_speedup"] and r["kbverify_speedup"]]
    lines = [f"kernels: {len(results)}; compiled/correct verdicts agree: {agree}/{len(results)}"]
    judged = [r for r in results if r["within_spread"] is not None]
    if judged:
        lines.append(f"speedups within the larger of the two tools' own run-to-run spread: "
                     f"{sum(r['within_spread'] for r in judged)}/{len(judged)}; median spread "
                     f"{statistics.median(r['measured_spread'] for r in judged):.3f}, median change "
                     f"{statistics.median(r['speedup_change'] for r in judged):.3f}")
    if ratios:
        lines.append(f"speedup kbverify/KernelBench: median {statistics.median(ratios):.3f}, "
                     f"min {min(ratios):.3f}, max {max(ratios):.3f}, "
                     f"median |change| {statistics.median(abs(x - 1) for x in ratios):.3f}, "
                     f"beyond ±30%: {sum(abs(x - 1) > 0.3 for x in ratios)} of {len(ratios)}")
    both = [r for r in results if r.get("kb_process_s") and r.get("kbverify_process_s")]
    if both:
        lines.append(f"wall per kernel kbverify/KernelBench: median "
                     f"{statistics.median(r['kbverify_process_s'] / r['kb_process_s'] for r in both):.2f}, "
                     f"mean kbverify {statistics.mean(r['kbverify_process_s'] for r in both):.1f} s, "
                     f"mean KernelBench {statistics.mean(r['kb_process_s'] for r in both):.1f} s ({len(both)} kernels)")
        modes = [_kb_baseline_mode(r) for r in both]
        where = {"separate": "timed in a process of its own", "same-process": "timed first in the eval process",
                 None: "not recorded"}
        lines.append("KernelBench's baseline: " + ", ".join(
            f"{where[mode]} for {modes.count(mode)}" for mode in sorted(set(modes), key=str))
            + f" (of {len(modes)} kernels)")
    live = [(r["kbverify_process_s"], statistics.median(k["process_s"] + k["baseline_s"] for k in r["kb_runs"]))
            for r in both if r.get("kb_runs") and all("baseline_s" in k for k in r["kb_runs"])]
    if live:
        lines.append(f"the same with KernelBench's baseline timed live too, as kbverify's is: median "
                     f"{statistics.median(kv / kb for kv, kb in live):.2f} ({len(live)} kernels)")
    return "\n".join(lines)


def _kb_baseline_mode(record: dict) -> str | None:
    """Where the record's KernelBench runs timed the baseline ("separate" or "same-process"); a record without
    `kb_baseline` timed it in the eval's process when it recorded baseline seconds at all."""
    runs = record.get("kb_runs") or []
    if not runs:
        return None
    if "kb_baseline" in runs[0]:
        return runs[0]["kb_baseline"]
    return "same-process" if "baseline_s" in runs[0] else None


if __name__ == "__main__":
    main()
