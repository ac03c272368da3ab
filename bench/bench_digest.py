"""What the timed-output check's digest costs per timed call, against one copy of the same output.

    python3 bench/bench_digest.py [--device cuda] [--repeats 5]

Prints, per output size, the median milliseconds of the end-event copy (`timing_sides.snapshot`), of the digest
(`timing_sides.digest`) and their ratio. The digest runs once per timed call on each side, outside the timed
region, so it spends the timing budget's wall time, not the measured time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kbverify.worker import timing_sides  # noqa: E402


def _median_ms(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'})")
    print(f"{'elements':>10} {'copy ms':>9} {'digest ms':>10} {'digest/copy':>12}")
    for elements in (1 << 16, 1 << 20, 1 << 23, 1 << 25):
        out = torch.randn(elements, device=args.device)
        slot: list = []
        timing_sides.snapshot([out], slot)
        copy_ms = _median_ms(lambda: timing_sides.snapshot([out], slot), args.device, args.repeats)
        digest_ms = _median_ms(lambda: timing_sides.digest(slot), args.device, args.repeats)
        print(f"{elements:>10} {copy_ms:>9.3f} {digest_ms:>10.3f} {digest_ms / copy_ms:>12.1f}")


if __name__ == "__main__":
    main()
