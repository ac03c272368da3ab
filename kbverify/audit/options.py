"""What one `kbverify audit` invocation asks for, beyond a single audit of a folder: copies sharing GPUs, their
memory admission, and the files they read and write."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kbverify.audit.footprint import AUDIT_MEMORY_FACTOR
from kbverify.audit.partial import settings_fingerprint
from kbverify.audit.records import AuditSettings
from kbverify.core.errors import InputError
from kbverify.core.protocols import parse_protocols

# With admission, memory no longer caps the copies: the host's cores and the GPU's SMs do. The H200 machine has
# 16 cores; 250 tasks at ~26 s of worker time each need ten or more copies busy to finish in ten minutes, and ten
# still leave cores for the launchers and forkservers.
DEFAULT_PER_GPU = 10


@dataclass(frozen=True)
class AuditOptions:
    """An audit run by one or more copies of `kbverify audit` sharing the task list (see `kbverify.audit.copies`)."""

    tasks: Path  # a task file, a level folder, or a folder of level folders
    out_prefix: Path  # writes OUT.json, OUT.md, OUT.partial.jsonl (the copies: OUT.shardI.*)
    device: str
    protocol: str = "original,kbv,verified"
    levels: tuple[int, ...] | None = None  # None: every level found
    hidden_tests: Path | None = None  # as given on the command line; the copies are given it again
    hidden_dirs: tuple[str, ...] = ()  # the manifests it resolves to (`validate.hidden_folders`)
    hidden_shapes: bool = True
    seeds: int = 3
    timeout_s: float = 900.0
    fresh: bool = False  # ignore OUT.partial.jsonl
    gpus: int = 1
    per_gpu: int = 1
    memory_budget_gib: float | None = None
    memory_factor: float = AUDIT_MEMORY_FACTOR
    footprints: Path | None = None
    peaks: Path | None = None
    mps: bool = True
    retry_per_gpu: int = 2
    estimate_only: bool = False
    report_only: bool = False
    compare_published: bool = False
    verbose: bool = False
    shard: str | None = None  # "K/N": this is copy K of N (set by the parent for its copies)
    claims: Path | None = None  # the copies' shared claims folder (set by the parent for its copies)

    def __post_init__(self):
        if self.gpus < 1 or self.per_gpu < 1 or self.retry_per_gpu < 0:
            raise InputError("--gpus and --per-gpu must be at least 1, --retry-per-gpu at least 0")
        if self.peaks is not None and not self.peaks.parent.is_dir():
            raise InputError(f"--peaks {self.peaks}: no folder {self.peaks.parent}")
        if self.estimate_only and self.footprints is None:
            raise InputError("--estimate-only needs --footprints CACHE.json")

    @property
    def sharded(self) -> bool:
        """Whether this invocation runs copies of itself (then every result is in the merged partial file)."""
        return self.gpus * self.per_gpu > 1 and not self.shard

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def partial(self) -> Path:
        return Path(f"{self.out_prefix}.partial.jsonl")

    def settings(self) -> AuditSettings:
        return AuditSettings(seeds=self.seeds, hidden_shapes=self.hidden_shapes, timeout_s=self.timeout_s,
                             hidden_dirs=tuple(str(d) for d in self.hidden_dirs))

    def fingerprint(self) -> str:
        """What this invocation's results are keyed by (`kbverify.audit.settings_fingerprint`)."""
        return settings_fingerprint(protocols=parse_protocols(self.protocol), device=self.device,
                                    settings=self.settings())


def audit_options(*, tasks: Path, out: Path | None, device: str, protocol: str, hidden_tests: Path | None,
                  hidden_dirs: Sequence[Path], verbose: bool, given: dict) -> AuditOptions | None:
    """The options of a `kbverify audit` that asks for more than one audit of a folder (`given`: the options
    beyond that, those left out being None), or None where it asks for no more."""
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return None
    if out is None:
        raise InputError(f"--{next(iter(given)).replace('_', '-')} needs --out")
    if isinstance(given.get("levels"), str):
        try:
            given["levels"] = tuple(sorted({int(level) for level in given["levels"].split(",") if level.strip()}))
        except ValueError:
            raise InputError(f"--levels {given['levels']!r}: give level numbers, e.g. 1,2,3") from None
    if given.get("per_gpu") is None:
        # copies share a GPU by default only when copies were asked for, on a GPU
        given["per_gpu"] = DEFAULT_PER_GPU if ("gpus" in given and device.startswith("cuda")) else 1
    return AuditOptions(tasks=tasks, out_prefix=out, device=device, protocol=protocol, hidden_tests=hidden_tests,
                        hidden_dirs=tuple(str(d) for d in hidden_dirs), verbose=verbose, **given)
