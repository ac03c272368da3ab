"""How much of a device's time the lease policy wastes: a store's real phase times replayed through the real
`kbverify.harness.device_share.DeviceLease`, with every phase a sleep, scaled.

    tar -xJf tests/data/gpu_stores.tar.xz -C /tmp h200-2026-12-03/call3/anchor_store_f_share4.sqlite
    python3 bench/bench_lease.py /tmp/h200-2026-12-03/call3/anchor_store_f_share4.sqlite [--scale 0.01]

Each verified verdict in the store gives a correctness phase (the longer of its candidate and judge workers) and,
where it was timed, an exclusive timing phase (timing worker, clean reference) and the check of the timed outputs
(shared, as `kbverify.harness.runner` runs it; `--check-exclusive` puts it back in the timing phase); each unit also gets an
`original` unit of `--original-s` under the exclusive lease (its one job checks and times). The units are shuffled
once (fixed seed) and evaluated by threads taking them from one queue, as `kbverify.rescore.rescore.LocalExecutor` does;
`--order` also replays them in other orders the executor could choose. Printed for each policy: the replayed wall in
the store's seconds, its ratio to one unit at a time, the lower bound (all exclusive work plus the correctness work
spread over every slot), the slot time left idle outside timing (in wall seconds: idle slot-seconds / slots) and
the drains (changes from correctness to timing). Builds, process starts outside the phases and the units' own
variation between runs are not modelled: the ratios compare policies, they do not predict a run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import queue
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.harness.device_share import DEFER_S, DeviceLease, LeaseEvent, batch_for, threads_for  # noqa: E402

# (correctness s, exclusive timing s, shared timing check s) of one unit
Unit = tuple[float, float, float]


def phases_from_store(path: Path, check_exclusive: bool = False) -> list[Unit]:
    """The phases of every verified verdict in a store (a .sqlite or a gzipped one)."""
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "store.sqlite"
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as source, open(local, "wb") as target:
                shutil.copyfileobj(source, target)
        else:
            shutil.copyfile(path, local)
        db = sqlite3.connect(local)
        try:
            rows = db.execute("select record from verdicts where protocol like 'verified%'").fetchall()
        finally:
            db.close()
    phases = []
    for (text,) in rows:
        workers = json.loads(text).get("worker_s") or {}
        correctness = max(workers.get("candidate", 0.0), workers.get("judge", 0.0))
        timing = workers.get("timing", 0.0) + workers.get("reference_timing", 0.0)
        check = workers.get("timing_check", 0.0)
        phases.append((correctness, timing + check, 0.0) if check_exclusive else (correctness, timing, check))
    return phases


def replay(work: list[Unit], lease: DeviceLease, threads: int, scale: float) -> float:
    """The wall, in the store's seconds, of `threads` threads evaluating `work` under `lease`."""
    pending: queue.Queue = queue.Queue()
    for item in work:
        pending.put(item)

    def evaluate() -> None:
        while True:
            try:
                correctness, timing, check = pending.get_nowait()
            except queue.Empty:
                return
            for kind, seconds in (("shared", correctness), ("exclusive", timing), ("shared", check)):
                if seconds:
                    with getattr(lease, kind)("unit"):
                        time.sleep(seconds * scale)

    started = time.monotonic()
    workers = [threading.Thread(target=evaluate) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.monotonic() - started) / scale


def idle_and_drains(events: list[LeaseEvent], slots: int, scale: float) -> tuple[float, int]:
    """Slot-seconds (store seconds) no phase held outside exclusive holds, and the drains, from a lease's events."""
    idle, drains, last_kind = 0.0, 0, None
    previous, shared, exclusive = events[0].at, 0, False
    for event in events:
        if not exclusive:
            idle += (slots - shared) * (event.at - previous) / scale
        previous, shared, exclusive = event.at, event.shared_holders, event.exclusive
        if event.action == "hold":
            drains += event.kind == "timing" and last_kind == "correctness"
            last_kind = event.kind
    return idle, drains


def ordered(work: list[Unit], order: str) -> list[Unit]:
    """The units in an order the executor could choose. `verified-first`/`original-first` use only what it knows
    (a unit's protocol); `oracle` sorts by the correctness times it does not know, to show what ordering could buy."""
    if order == "verified-first":
        return sorted(work, key=lambda unit: unit[0] == 0)
    if order == "original-first":
        return sorted(work, key=lambda unit: unit[0] != 0)
    if order == "oracle":
        return sorted(work, key=lambda unit: -unit[0])
    return list(work)


def policies(slots: int, threads: str) -> list[tuple[str, int, int]]:
    """(label, threads, batch) of the policies to replay with `slots` slots: the default is threads_for/batch_for."""
    chosen = [(f"{slots} slots, drain at once", slots, 1)]
    for count in sorted({threads_for(slots), *(int(t) * slots for t in threads.split(",") if t)}):
        if count > slots:
            batch = count - slots
            default = " (default)" if (count, batch) == (threads_for(slots), batch_for(slots)) else ""
            chosen.append((f"{slots} slots, {count} threads, batch {batch}{default}", count, batch))
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--scale", type=float, default=0.01, help="replayed seconds per stored second")
    parser.add_argument("--original-s", type=float, default=1.4,
                        help="each unit's original-protocol job (issue 22's H200 median); 0 leaves them out")
    parser.add_argument("--slots", default="4")
    parser.add_argument("--threads", default="2,4,8", help="threads per slot to replay besides drain at once")
    parser.add_argument("--order", default="shuffled", help="shuffled, verified-first, original-first, oracle")
    parser.add_argument("--check-exclusive", action="store_true", help="the timing check in the timing phase")
    args = parser.parse_args(argv)
    phases = phases_from_store(args.store, args.check_exclusive)
    if not phases:
        print(f"{args.store}: no verified verdicts", file=sys.stderr)
        return 2
    work = phases + ([(0.0, args.original_s, 0.0)] * len(phases) if args.original_s else [])
    random.Random(1).shuffle(work)
    exclusive, shared = sum(unit[1] for unit in work), sum(unit[0] + unit[2] for unit in work)
    alone = replay(work, DeviceLease("sim", 1), 1, args.scale)
    print(f"{len(phases)} units (+{len(phases) if args.original_s else 0} original); exclusive {exclusive:.0f} s, "
          f"shared {shared:.0f} s; defer_s {DEFER_S:g}")
    print(f"{'order':<15} {'policy':<40} {'wall s':>7} {'vs alone':>8} {'bound':>6} {'idle':>5} {'drains':>6}")
    print(f"{'':<15} {'one unit at a time':<40} {alone:7.0f} {1.0:8.2f} {exclusive + shared:6.0f}")
    for order in args.order.split(","):
        for slots in (int(s) for s in args.slots.split(",")):
            for label, threads, batch in policies(slots, args.threads):
                events: list[LeaseEvent] = []
                lease = DeviceLease("sim", slots, batch=batch, defer_s=DEFER_S * args.scale, observer=events.append)
                wall = replay(ordered(work, order), lease, threads, args.scale)
                idle, drains = idle_and_drains(events, slots, args.scale)
                print(f"{order:<15} {label:<40} {wall:7.0f} {wall / alone:8.2f} {exclusive + shared / slots:6.0f} "
                      f"{idle / slots:5.0f} {drains:6d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
