"""nvidia-smi's view of the GPUs while the audit's copies run: whether the GPU or memory admission is what limits
the audit (a busy GPU cannot go faster with more copies; an idle one waits on memory or the CPU)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class GpuSampler:
    """Samples every second into a CSV file until stopped."""

    def __init__(self, path: Path, process: subprocess.Popen):
        self.path, self.process = path, process

    @classmethod
    def start(cls, path: Path) -> GpuSampler | None:
        if not shutil.which("nvidia-smi"):
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "w")
        process = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu,memory.used",
                                    "--format=csv,noheader,nounits", "-lms", "1000"], stdout=handle,
                                   stderr=subprocess.DEVNULL)
        handle.close()
        return cls(path, process)

    def stop(self) -> str:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return summarize_gpu_samples(self.path.read_text())


def summarize_gpu_samples(text: str) -> str:
    """One line from nvidia-smi's CSV samples (timestamp, index, utilization %, memory MiB)."""
    busy, memory = [], []
    for row in text.splitlines():
        parts = [part.strip() for part in row.split(",")]
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            busy.append(int(parts[2]))
            memory.append(int(parts[3]))
    if not busy:
        return "gpu: no utilization samples"
    ordered = sorted(busy)
    return (f"gpu: {len(busy)} samples, utilization median {ordered[len(ordered) // 2]}%, "
            f"at least 90% in {100 * sum(b >= 90 for b in busy) / len(busy):.0f}% of them, "
            f"below 50% in {100 * sum(b < 50 for b in busy) / len(busy):.0f}%; "
            f"memory used max {max(memory) / 1024:.1f} GiB")
