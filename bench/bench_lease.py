"""How much of a device's time the lease policy wastes: a store's real phase times replayed through the real
`kbverify.device_share.DeviceLease`, with every phase a sleep, scaled.

    python3 bench/bench_lease.py results/h200-2026-12-03/call3/anchor_store_f_share4.sqlite.gz [--scale 0.02]

Each verified verdict in the store gives a correctness phase (the longer of its candidate and judge workers) and,
where it was timed, a timing phase (timing worker, timing check, clean reference); each unit also gets an
`original` unit of `--original-s` under the exclusive lease (its one job checks and times). The units are shuffled
once (fixed seed) and evaluated by threads taking them from one queue, as `kbverify.rescore.LocalExecutor` does.
Printed for each policy: the replayed wall in the store's seconds, its ratio to one unit at a time, and the lower
bound (all exclusive work plus the correctness work spread over every slot). Builds, process starts outside the
phases and the units' own variation between runs are not modelled: the ratios compare policies, they do not
predict a run.
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

from kbverify.device_share import DeviceLease, batch_for, threads_for  # noqa: E402


def phases_from_store(path: Path) -> list[tuple[float, float]]:
    """(correctness s, timing s) of every verified verdict in a store (a .sqlite or a gzipped one)."""
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
        timing = sum(workers.get(job, 0.0) for job in ("timing", "timing_check", "reference_timing"))
        phases.append((correctness, timing))
    return phases


def replay(work: list[tuple[float, float]], lease: DeviceLease, threads: int, scale: float) -> float:
    """The wall, in the store's seconds, of `threads` threads evaluating `work` under `lease`."""
    pending: queue.Queue = queue.Queue()
    for item in work:
        pending.put(item)

    def evaluate() -> None:
        while True:
            try:
                correctness, timing = pending.get_nowait()
            except queue.Empty:
                return
            if correctness:
                with lease.shared("unit"):
                    time.sleep(correctness * scale)
            if timing:
                with lease.exclusive("unit"):
                    time.sleep(timing * scale)

    started = time.monotonic()
    workers = [threading.Thread(target=evaluate) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.monotonic() - started) / scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--scale", type=float, default=0.02, help="replayed seconds per stored second")
    parser.add_argument("--original-s", type=float, default=1.4,
                        help="each unit's original-protocol job (issue 22's H200 median); 0 leaves them out")
    parser.add_argument("--slots", default="2,4,8")
    args = parser.parse_args(argv)
    phases = phases_from_store(args.store)
    if not phases:
        print(f"{args.store}: no verified verdicts", file=sys.stderr)
        return 2
    work = [(c, t) for c, t in phases] + ([(0.0, args.original_s)] * len(phases) if args.original_s else [])
    random.Random(1).shuffle(work)
    exclusive, shared = sum(t for _, t in work), sum(c for c, _ in work)
    alone = replay(work, DeviceLease("sim", 1), 1, args.scale)
    print(f"{len(phases)} units (+{len(phases) if args.original_s else 0} original); exclusive {exclusive:.0f} s, "
          f"correctness {shared:.0f} s")
    print(f"{'policy':<34} {'wall s':>8} {'vs alone':>9} {'lower bound':>12}")
    print(f"{'one unit at a time':<34} {alone:8.0f} {1.0:9.2f} {exclusive + shared:12.0f}")
    for slots in (int(s) for s in args.slots.split(",")):
        bound = exclusive + shared / slots
        fifo = replay(work, DeviceLease("sim", slots), slots, args.scale)
        print(f"{f'{slots} slots, drain at once':<34} {fifo:8.0f} {fifo / alone:9.2f} {bound:12.0f}")
        threads, batch = threads_for(slots), batch_for(slots)
        batched = replay(work, DeviceLease("sim", slots, batch=batch), threads, args.scale)
        label = f"{slots} slots, {threads} threads, batch {batch}"
        print(f"{label:<34} {batched:8.0f} {batched / alone:9.2f} {bound:12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
