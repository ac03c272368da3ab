"""Which step of the host kind moves a forward's host-inclusive time away from KernelBench's (issue 20, B).

KernelBench times each call with events around it and a synchronise after, on one input tensor, no L2 flush,
calls back to back. The host kind (kbverify.worker.timed_call, kind "host") adds, before each call: a fresh draw
copied into the call's input, an L2 flush, a device-wide synchronise, and between calls the harness's own work
(the device idles). This script times the reference and a submission under KernelBench's loop with those steps
added one at a time, in one process, interleaved call by call, and prints each variant's medians and ratio: the
variant where the ratio leaves KernelBench's is the step that matters. `churn` is host work between calls (the
harness's Python), `project` and `poison` the harness's work on the output after the call; the `+worker` variants
run last, under a timing worker's state (one torch thread, the tripwire audit hook).

    python3 bench/host_kind_factors.py TASK.py SUBMISSION.py [--calls 200] [--idle-ms 1.0]

GPU only (the events and the flush are CUDA's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


VARIANTS = ("kernelbench", "+flush", "+fresh_input", "+idle", "+idle+warm", "+all", "+all+warm",
            "+flush+fresh_input", "+churn", "+flush+fresh_input+churn", "+flush+fresh_input+churn+project+poison")
# Run last, in the state a timing worker is in (its audit hook cannot be removed again): one torch thread and the
# tripwire audit hook (kbverify.worker.guards), as the candidate's and the reference's timed calls run under it.
WORKER_VARIANTS = ("+worker", "+worker+flush+fresh_input+churn+project+poison")


def _churn(seconds: float) -> None:
    """Host work like the harness's between two calls (dicts, lists, hashing, JSON), with the device idle: the
    host's caches and branch predictors hold the harness, not the forward, when the next call starts."""
    import hashlib
    import json

    deadline = time.perf_counter() + seconds
    blob = bytes(range(256)) * 256
    while time.perf_counter() < deadline:
        record = {str(i): [i, i * 0.5, str(i)] for i in range(200)}
        hashlib.sha256(json.dumps(record).encode() + blob).hexdigest()


def _one(model, inputs, get_inputs, flush, variant: str, idle_s: float) -> float:
    import torch

    steps = set(variant.split("+")[1:])
    if "all" in steps:
        steps |= {"flush", "fresh_input", "idle"}
    if "warm" in steps:
        time.sleep(idle_s)
        model(*inputs)  # an untimed call first
        torch.cuda.synchronize()
    if "churn" in steps:
        _churn(idle_s)
    if "fresh_input" in steps:
        with torch.device("cuda"):  # drawn on the device, as the timing worker draws
            fresh = get_inputs()
        for target, value in zip(inputs, fresh):
            if isinstance(target, torch.Tensor):
                target.copy_(value)
    if "flush" in steps:
        flush.zero_()
    torch.cuda.synchronize()
    if "idle" in steps and "warm" not in steps:
        time.sleep(idle_s)  # the device idles
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = model(*inputs)
    end.record()
    if "project" in steps:  # a few reductions of the output, stream-ordered after the call, as the harness projects
        flat = out.float().flatten()
        _ = (flat.sum(), flat.abs().max(), flat[:: max(1, flat.numel() // 1024)].clone())
    torch.cuda.synchronize()
    if "poison" in steps:
        out.fill_(float("nan"))
        torch.cuda.synchronize()
    return start.elapsed_time(end)


def _table(reference, candidate, inputs, get_inputs, flush, variants, args) -> None:
    for variant in variants:
        times = {"ref": [], "cand": []}
        for call in range(args.calls):
            order = [("ref", reference), ("cand", candidate)]
            if call % 2:  # alternating, so neither side always follows the other
                order.reverse()
            for name, model in order:
                times[name].append(_one(model, inputs, get_inputs, flush, variant, args.idle_ms / 1e3))
        ref, cand = statistics.median(times["ref"]), statistics.median(times["cand"])
        mean_ratio = statistics.mean(times["ref"]) / statistics.mean(times["cand"])
        print(f"{variant:>44} {ref:9.4f} {cand:9.4f} {ref / cand:8.3f}  (means: {mean_ratio:.3f})", flush=True)


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
        print(f"{'variant':>44} {'ref ms':>9} {'cand ms':>9} {'speedup':>8}")
        _table(reference, candidate, inputs, get_inputs, flush, VARIANTS, args)
        from kbverify.worker import guards

        torch.set_num_threads(1)
        guards.install_tripwires()
        _table(reference, candidate, inputs, get_inputs, flush, WORKER_VARIANTS, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
