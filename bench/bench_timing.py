"""How precise is kbverify's interleaved timing on this GPU, and how does KernelBench's own method compare?

    python3 bench/bench_timing.py --out DIR [--device cuda:0] [--repeats 3] [--budget-s 2.0] [--only NAME,...]

For each benchmark task (references from ~10 us to a few ms):
  1. A/A: the reference timed against an identical copy of itself by the `reference_timing` worker (interleaved
     rounds, L2 flushed, fresh inputs per call), `--repeats` times in fresh processes: |estimate - 1|, the 95% CI
     half-width, the rounds and seconds of timing each measurement took.
  2. The known 2x case: a ModelNew that calls the reference forward twice, timed by the `timing` worker against
     one call: the estimate should be about 0.5 with 0.5 inside (or close to) its CI. Twice on the same inputs
     the second call reads what the first left in L2; the "cold" variant runs the second call on inputs of its
     own, so nothing is shared and the work is exactly doubled. A fixed cost per timed call (the event pair,
     the first launch) puts the 2x case above 0.5 by its share; a 3x case checks that: predicted from the 2x
     case alone under t_k = k*W + f, its measurement must contain the prediction, and f is printed in us.
  3. KernelBench's method (time_execution_with_cuda_event: 3 warm-ups, 100 trials on the same inputs, a
     synchronise after each, mean; reference then copy, no interleaving), re-implemented here, same repeats.
  4. For matmul and convolution tasks: the TF32 baseline (matmul and cuDNN TF32 on, as `verified` times it)
     against PyTorch's default flags (matmul TF32 off, cuDNN TF32 on, as KernelBench timed it), interleaved.
Prints a table and writes DIR/bench_timing.json with every raw number. Built to finish in under 6 minutes on one
H200 with the defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kbverify.core import stats  # noqa: E402
from kbverify.core.inputs import new_run_secret  # noqa: E402
from kbverify.core.tasks import Task, load_task  # noqa: E402
from kbverify.harness.sandbox import run_child  # noqa: E402
from kbverify.timing import timing_control  # noqa: E402

log = logging.getLogger("bench_timing")

TASKS = REPO / "tasks" / "gpu"


@dataclass(frozen=True)
class BenchTask:
    name: str
    path: Path
    tf32_sensitive: bool  # runs a cuBLAS matmul or a cuDNN convolution: TF32 flags change what it computes


BENCH_TASKS = (
    BenchTask("relu_4096x8192", TASKS / "level1" / "1_ReLU_4096x8192.py", False),
    BenchTask("relu_16x16384", TASKS / "level1" / "2_ReLU_16x16384.py", False),
    BenchTask("matmul_4096", TASKS / "level1" / "4_Matmul_4096_square.py", True),
    BenchTask("conv_relu_128x16x128", TASKS / "level2" / "2_Conv2d_ReLU_BiasAdd_128x16x128.py", True),
    BenchTask("layernorm_8192x1024", TASKS / "level1" / "7_LayerNorm_8192x1024.py", False),
    BenchTask("softmax_16x16384", TASKS / "level1" / "6_Softmax_16x16384_rand.py", False),
)

# The reference called twice per forward: exactly twice the work of one call.
TWICE_SOURCE = '''
class ModelNew(Model):
    def forward(self, *args):
        super().forward(*args)
        return super().forward(*args)
'''

# Twice the work with nothing shared: the second call runs on inputs of its own, drawn once at construction, so
# it finds none of the first call's data in L2. Calling twice on the same inputs measured 0.505-0.51 on the
# H200 where the data exceed L2 and 0.57-0.61 on small tasks: the second call reads what the first left in L2.
TWICE_COLD_SOURCE = '''
class ModelNew(Model):
    def __init__(self, *args):
        super().__init__(*args)
        self._spare = list(get_inputs())
        for index, value in enumerate(self._spare):
            if isinstance(value, torch.Tensor):
                self.register_buffer(f"_spare{index}", value)

    def forward(self, *args):
        out = super().forward(*args)
        super().forward(*[getattr(self, f"_spare{index}", value) for index, value in enumerate(self._spare)])
        return out
'''

# Three times the work, the second and third calls on inputs of their own. With a fixed cost f per timed call
# (the event pair, the first launch) on top of the work W, t_k = k*W + f: the 2x case comes out above 0.5 by
# f's share, and the 3x case is then predicted by the 2x case alone (1/rho_3 = 2/rho_2 - 1). The prediction
# holding is what shows the estimator measures added work exactly; f is reported in microseconds.
THRICE_COLD_SOURCE = '''
class ModelNew(Model):
    def __init__(self, *args):
        super().__init__(*args)
        self._spares = [list(get_inputs()), list(get_inputs())]
        for copy, spare in enumerate(self._spares):
            for index, value in enumerate(spare):
                if isinstance(value, torch.Tensor):
                    self.register_buffer(f"_spare{copy}_{index}", value)

    def forward(self, *args):
        out = super().forward(*args)
        for copy, spare in enumerate(self._spares):
            super().forward(*[getattr(self, f"_spare{copy}_{index}", value) for index, value in enumerate(spare)])
        return out
'''

# The reference under PyTorch's default flags, timed against the TF32 baseline.
DEFAULT_FLAGS_SOURCE = '''
import torch


class ModelNew(Model):
    def forward(self, *args):
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = True
        try:
            return super().forward(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
'''


def _timing_payload(task: Task, source: str, args, jitter_bytes: int = 0) -> dict:
    return {"task_source": task.source, "task_name": task.name, "submission_source": source,
            "device": args.device, "secret": new_run_secret(), "budget_s": args.budget_s,
            "ci_half_width": args.ci_half_width, "train_mode": True, "baseline_matmul_tf32": True,
            "baseline_cudnn_tf32": True, "candidate_grad_enabled": False, "placement_jitter_bytes": jitter_bytes}


def _kinds(device: str) -> tuple:
    """The kinds of batch the pipeline runs (timing_control.kinds_for)."""
    return timing_control.kinds_for(device, "auto")


def _interleaved(job: str, task: Task, source: str, args, jitter_bytes: int = 0) -> dict:
    """One measurement, each side in a fresh worker of its own as the pipeline times it (the reference's in a
    `reference_timing` worker); the estimate is recomputed here from the raw rounds."""
    started = time.monotonic()
    payload = _timing_payload(task, source, args, jitter_bytes)
    workers = {"ref": ("reference_timing", payload), "cand": (job, payload)}
    outcomes, driven = timing_control.run(workers,
                                         timeout_s=args.timeout_s, device=args.device, budget_s=args.budget_s,
                                         target_half_width=args.ci_half_width, check=False,
                                         kinds=_kinds(args.device))
    wall_s = time.monotonic() - started
    outcome = outcomes["cand"]
    record = outcome.result or {}
    rounds = [(r["ref_ms"], r["cand_ms"]) for r in driven.rounds]
    if not rounds:
        reason = record.get("error") or record.get("load_error") or (outcome.output_tail or "")[-500:]
        return {"error": reason or "no rounds", "wall_s": wall_s}
    estimate = stats.paired_speedup(rounds)
    host_rounds = timing_control.paired_rounds(driven.rounds, "host")
    host = stats.paired_speedup(host_rounds) if host_rounds else None
    return {"host_ci_half_width": stats.half_width(host) if host else None,
            "estimate": estimate.speedup, "ci": [estimate.ci_low, estimate.ci_high],
            "ci_half_width": stats.half_width(estimate), "rounds": len(rounds), "method": estimate.method,
            "ref_ms": statistics.median(t for r in rounds for t in r[0]),
            "cand_ms": statistics.median(t for r in rounds for t in r[1]),
            "timing_s": record.get("timing_s"), "wall_s": wall_s, "phase_ms_per_call": record.get("phase_ms_per_call"),
            "cover_ms": record.get("cover_ms"), "uncovered_calls": record.get("uncovered_calls"),
            "between_rounds_ms": statistics.mean(r.get("between_ms", 0.0) for r in driven.rounds)}


# ---- KernelBench's method, re-implemented (scripts/generate_baseline_time.py + src/eval.py of v0.1) ---------

def _kernelbench_times(model, inputs, *, warmups: int, trials: int, torch) -> list[float]:
    with torch.no_grad():
        for _ in range(warmups):
            model(*inputs)
            torch.cuda.synchronize()
        times = []
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return times


def kernelbench_aa(task: Task, args) -> list[dict]:
    """Reference then an identical copy, each 3 warm-ups + 100 trials on the same inputs, means compared."""
    import torch

    from kbverify.core.tasks import execute_task
    from kbverify.worker.precision import set_tf32

    device = torch.device(args.device)
    torch.cuda.set_device(device.index or 0)  # "cuda" names no index: the current device
    set_tf32(matmul=False, cudnn=True)  # PyTorch's defaults, as KernelBench's baselines were timed
    results = []
    for repeat in range(args.repeats):
        namespace = execute_task(task)
        torch.manual_seed(42)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
        torch.manual_seed(42)
        init = namespace["get_init_inputs"]()
        torch.manual_seed(42)
        reference = namespace["Model"](*init).to(device)
        torch.manual_seed(42)
        copy = namespace["Model"](*init).to(device)
        ref_ms = statistics.fmean(_kernelbench_times(reference, inputs, warmups=3, trials=100, torch=torch))
        copy_ms = statistics.fmean(_kernelbench_times(copy, inputs, warmups=3, trials=100, torch=torch))
        results.append({"repeat": repeat, "ref_ms": ref_ms, "copy_ms": copy_ms, "ratio": ref_ms / copy_ms})
        del reference, copy, inputs
        torch.cuda.empty_cache()
    return results


# ---- summaries ----------------------------------------------------------------------------------------------

def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(name: str, entry: dict) -> dict:
    aa = [m for m in entry["aa"] if "estimate" in m]
    kb = entry.get("kernelbench_aa", [])
    twice = entry.get("twice") or {}
    cold = entry.get("twice_cold") or {}
    jittered = [m for m in entry.get("aa_jitter", []) if "estimate" in m]
    tf32 = entry.get("tf32_vs_default") or {}
    ratios = [m["ratio"] for m in kb]
    linearity = fixed_cost_check(cold, entry.get("thrice_cold") or {})
    ref_ms = _median(m["ref_ms"] for m in aa)
    return {
        "task": name,
        "ref_ms": ref_ms,
        "aa_abs_dev": _median(abs(m["estimate"] - 1.0) for m in aa),
        "aa_ci_half_width": _median(m["ci_half_width"] for m in aa),
        "aa_host_ci_half_width": _median(m.get("host_ci_half_width") for m in aa),
        "aa_ci_covers_1": sum(m["ci"][0] <= 1.0 <= m["ci"][1] for m in aa),
        "aa_n": len(aa),
        "aa_timing_s": _median(m["timing_s"] for m in aa),
        "aa_rounds": _median(m["rounds"] for m in aa),
        "kb_abs_dev": _median(abs(r - 1.0) for r in ratios),
        "kb_half_range": (max(ratios) - min(ratios)) / 2 if ratios else None,
        "twice": twice.get("estimate"),
        "twice_ci": twice.get("ci"),
        "twice_covers_half": (twice["ci"][0] <= 0.5 <= twice["ci"][1]) if "ci" in twice else None,
        "twice_cold": cold.get("estimate"),
        "twice_cold_ci": cold.get("ci"),
        "twice_cold_covers_half": (cold["ci"][0] <= 0.5 <= cold["ci"][1]) if "ci" in cold else None,
        "thrice_cold": linearity.get("measured"),
        "thrice_cold_ci": linearity.get("ci"),
        "thrice_predicted": linearity.get("predicted"),
        "thrice_predicted_in_ci": linearity.get("predicted_in_ci"),
        "fixed_cost_share": linearity.get("fixed_share"),
        "fixed_cost_us": (linearity["fixed_share"] * ref_ms * 1e3
                          if linearity.get("fixed_share") is not None and ref_ms else None),
        "between_rounds_ms": _median(m.get("between_rounds_ms") for m in aa),
        "aa_jitter_abs_dev": _median(abs(m["estimate"] - 1.0) for m in jittered) if jittered else None,
        "aa_jitter_ci_half_width": _median(m["ci_half_width"] for m in jittered) if jittered else None,
        # the candidate ran with default flags against the TF32 baseline: TF32's gain is its reciprocal
        "tf32_gain": (1.0 / tf32["estimate"]) if "estimate" in tf32 else None,
        "tf32_gain_ci": [1.0 / tf32["ci"][1], 1.0 / tf32["ci"][0]] if "ci" in tf32 else None,
    }


def fixed_cost_check(twice: dict, thrice: dict) -> dict:
    """The 3x case predicted from the 2x case under t_k = k*W + f (see THRICE_COLD_SOURCE), against its
    measurement; `fixed_share` is f / t_1."""
    if "estimate" not in twice or "estimate" not in thrice:
        return {}
    predicted = 1.0 / (2.0 / twice["estimate"] - 1.0)
    return {"measured": thrice["estimate"], "ci": thrice["ci"], "predicted": predicted,
            "predicted_in_ci": thrice["ci"][0] <= predicted <= thrice["ci"][1],
            "fixed_share": 2.0 - 1.0 / twice["estimate"]}


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def print_table(rows: list[dict]) -> None:
    header = ("task", "ref ms", "A/A |d|", "A/A CI±", "CI∋1", "s/meas", "rounds", "KB |d|", "KB ½range",
              "2x est", "2x CI", "2x cold", "2x cold CI", "3x cold [CI]", "3x pred", "fixed µs", "TF32 gain",
              "A/A |d| jitter")
    lines = [header]
    for r in rows:
        twice_ci = "-" if not r["twice_ci"] else f"[{r['twice_ci'][0]:.3f}, {r['twice_ci'][1]:.3f}]"
        cold_ci = "-" if not r["twice_cold_ci"] else f"[{r['twice_cold_ci'][0]:.3f}, {r['twice_cold_ci'][1]:.3f}]"
        lines.append((r["task"], _fmt(r["ref_ms"], ".4f"), _fmt(r["aa_abs_dev"], ".3f", 100) + "%",
                      _fmt(r["aa_ci_half_width"], ".3f", 100) + "%", f"{r['aa_ci_covers_1']}/{r['aa_n']}",
                      _fmt(r["aa_timing_s"], ".2f"), _fmt(r["aa_rounds"], ".0f"),
                      _fmt(r["kb_abs_dev"], ".2f", 100) + "%", _fmt(r["kb_half_range"], ".2f", 100) + "%",
                      _fmt(r["twice"], ".3f"), twice_ci, _fmt(r["twice_cold"], ".3f"), cold_ci,
                      "-" if not r["thrice_cold_ci"] else
                      f"{r['thrice_cold']:.3f} [{r['thrice_cold_ci'][0]:.3f}, {r['thrice_cold_ci'][1]:.3f}]",
                      _fmt(r["thrice_predicted"], ".3f"), _fmt(r["fixed_cost_us"], ".2f"),
                      _fmt(r["tf32_gain"], ".2f"), _fmt(r["aa_jitter_abs_dev"], ".3f", 100) + "%"))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    for index, line in enumerate(lines):
        print("  ".join(str(cell).rjust(width) for cell, width in zip(line, widths)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for bench_timing.json")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--repeats", type=int, default=3, help="A/A measurements per task and method")
    parser.add_argument("--budget-s", type=float, default=2.0, help="timing budget per interleaved measurement")
    parser.add_argument("--ci-half-width", type=float, default=0.005, help="adaptive stop: target CI half-width")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="hard limit per worker")
    parser.add_argument("--only", default="", help="comma-separated task names (default: all)")
    parser.add_argument("--placement-jitter-bytes", type=int, default=0,
                        help="also run the A/A with a spacer of up to this many bytes before each call's tensors")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.device.startswith("cuda"):
        # a dry run of the plumbing (CUDA events, L2 flush and the TF32 comparison do not exist there)
        logging.warning("not a CUDA device: a dry run, the numbers mean nothing")
    wanted = {name for name in args.only.split(",") if name}
    chosen = [t for t in BENCH_TASKS if not wanted or t.name in wanted]
    if not chosen:
        parser.error(f"--only matches none of {', '.join(t.name for t in BENCH_TASKS)}")
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    results: dict = {}
    # Workers first: this process touches CUDA only for KernelBench's method, at the end.
    for bench in chosen:
        task = load_task(bench.path)
        entry: dict = {"task": task.key, "aa": []}
        for repeat in range(args.repeats):
            entry["aa"].append(_interleaved("reference_timing", task, "", args))
            print(f"{bench.name}: A/A {repeat + 1}/{args.repeats}: {_brief(entry['aa'][-1])}", flush=True)
        for repeat in range(args.repeats if args.placement_jitter_bytes else 0):
            entry.setdefault("aa_jitter", []).append(
                _interleaved("reference_timing", task, "", args, args.placement_jitter_bytes))
            print(f"{bench.name}: A/A with placement jitter {repeat + 1}/{args.repeats}: "
                  f"{_brief(entry['aa_jitter'][-1])}", flush=True)
        entry["twice"] = _interleaved("timing", task, TWICE_SOURCE, args)
        print(f"{bench.name}: 2x case: {_brief(entry['twice'])}", flush=True)
        entry["twice_cold"] = _interleaved("timing", task, TWICE_COLD_SOURCE, args)
        print(f"{bench.name}: 2x case, second call on its own inputs: {_brief(entry['twice_cold'])}", flush=True)
        entry["thrice_cold"] = _interleaved("timing", task, THRICE_COLD_SOURCE, args)
        print(f"{bench.name}: 3x case, each call on its own inputs: {_brief(entry['thrice_cold'])}", flush=True)
        if bench.tf32_sensitive:
            entry["tf32_vs_default"] = _interleaved("timing", task, DEFAULT_FLAGS_SOURCE, args)
            print(f"{bench.name}: default flags vs TF32: {_brief(entry['tf32_vs_default'])}", flush=True)
        results[bench.name] = entry
    for bench in chosen if args.device.startswith("cuda") else ():  # KernelBench's method needs CUDA events
        results[bench.name]["kernelbench_aa"] = kernelbench_aa(load_task(bench.path), args)
    rows = [summarize(name, entry) for name, entry in results.items()]
    wall_s = time.monotonic() - started
    print()
    print_table(rows)
    print(f"\n{len(rows)} tasks in {wall_s:.0f} s")
    out_path = args.out / "bench_timing.json"
    out_path.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall_s,
                                    "summary": rows, "raw": results}, indent=1))
    print(f"wrote {out_path}")
    return 0


def _brief(measurement: dict) -> str:
    if "error" in measurement:
        return "error: " + str(measurement["error"])[:200]
    return (f"{measurement['estimate']:.4f} [{measurement['ci'][0]:.4f}, {measurement['ci'][1]:.4f}] "
            f"({measurement['rounds']} rounds, {measurement['timing_s'] or 0:.2f} s timed, "
            f"{measurement['wall_s']:.1f} s wall)")


if __name__ == "__main__":
    sys.exit(main())
