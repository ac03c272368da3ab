"""Which step of the host kind moves a forward's host-inclusive time away from KernelBench's (issue 20, B).

KernelBench times each call with events around it and a synchronise after, on one input tensor, no L2 flush,
calls back to back. The host kind (kbverify.child.timed_call, kind "host") adds, before each call: a fresh draw
copied into the call's input, an L2 flush, a device-wide synchronise, and between calls the harness's own work
(the device idles). This script times the reference and a submission under KernelBench's loop with those steps
added one at a time, in one process, interleaved call by call, and prints each variant's medians and ratio: the
variant where the ratio leaves KernelBench's is the step that matters.

    python3 bench/host_kind_factors.py TASK.py SUBMISSION.py [--calls 200] [--idle-ms 1.0]

GPU only (the events and the flush are CUDA's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _load(task_path: str, submission_path: str):
    import torch

    namespace: dict = {}
    exec(compile(open(task_path).read(), task_path, "exec"), namespace)
    reference = namespace["Model"](*namespace["get_init_inputs"]()).cuda()
    submission = dict(namespace)
    exec(compile(open(submission_path).read(), submission_path, "exec"), submission)
    candidate = submission["ModelNew"](*namespace["get_init_inputs"]()).cuda()
    inputs = [v.cuda() if isinstance(v, torch.Tensor) else v for v in namespace["get_inputs"]()]
    return reference, candidate, inputs, namespace["get_inputs"]


VARIANTS = ("kernelbench", "+flush", "+fresh_input", "+idle", "+idle+warm", "+all", "+all+warm")


def _one(model, inputs, get_inputs, flush, variant: str, idle_s: float) -> float:
    import torch

    if variant in ("+idle+warm", "+all+warm"):
        time.sleep(idle_s)
        model(*inputs)  # an untimed call first, as the host kind makes (kbverify.child.timed_call._warm_call)
        torch.cuda.synchronize()
    if variant in ("+fresh_input", "+all", "+all+warm"):
        with torch.device("cuda"):  # drawn on the device, as the timing worker draws
            fresh = get_inputs()
        for target, value in zip(inputs, fresh):
            if isinstance(target, torch.Tensor):
                target.copy_(value)
    if variant in ("+flush", "+all", "+all+warm"):
        flush.zero_()
    torch.cuda.synchronize()
    if variant in ("+idle", "+all"):
        time.sleep(idle_s)  # the harness's work between calls: the device idles
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(*inputs)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task")
    parser.add_argument("submission")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--idle-ms", type=float, default=1.0)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    reference, candidate, inputs, get_inputs = _load(args.task, args.submission)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)
    flush = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for _ in range(10):
            reference(*inputs), candidate(*inputs)
        torch.cuda.synchronize()
        print(f"{'variant':>14} {'ref ms':>9} {'cand ms':>9} {'speedup':>8}")
        for variant in VARIANTS:
            times = {"ref": [], "cand": []}
            for call in range(args.calls):
                order = [("ref", reference), ("cand", candidate)]
                if call % 2:  # alternating, so neither side always follows the other
                    order.reverse()
                for name, model in order:
                    times[name].append(_one(model, inputs, get_inputs, flush, variant, args.idle_ms / 1e3))
            ref, cand = statistics.median(times["ref"]), statistics.median(times["cand"])
            mean_ratio = statistics.mean(times["ref"]) / statistics.mean(times["cand"])
            print(f"{variant:>14} {ref:9.4f} {cand:9.4f} {ref / cand:8.3f}  (means: {mean_ratio:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
