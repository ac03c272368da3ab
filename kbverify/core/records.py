"""Frozen records: what a verdict holds. Raw evidence is kept so a verdict can be recomputed (`rejudge`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kbverify.core.status import Status

# The verdict record's format (`format_version` in `Verdict.to_dict`). Each version, and what a reader must accept:
#   0  no `format_version` key; fields added since then take their defaults (`isolation` reads "degraded": nothing
#      in such a record shows its submission code was confined);
#   1  `format_version` written with every record.
# A field may be added without a new version when its default reads every older record correctly.
RECORD_VERSION = 1


def task_label(task_name: str, level: int | None) -> str:
    """How the score tables name a task: `level<L>/<name>`, or its name when the level is unknown."""
    return task_name if level is None else f"level{level}/{task_name}"

@dataclass(frozen=True)
class SetResult:
    """One input set: how it was drawn and what the comparison found."""

    set_id: str  # "<shape>/<distribution>/<weights>/<seed index>", stable across runs of one protocol
    shape: str  # "original" or "hidden:<n>"
    distribution: str
    weights: str  # "default" | "rerandomized" | "loaded"
    seed: int
    valid: bool  # False: the reference itself raised or went non-finite; never counted against a kernel
    status: Status
    detail: str = ""
    errors: dict = field(default_factory=dict)  # error summary (correctness.summarize); raw, unrounded
    guards: dict = field(default_factory=dict)  # per-set guard evidence (aliasing, mutation, determinism)


@dataclass(frozen=True)
class BuildRecord:
    native_sources: bool  # the source calls load_inline/load/cpp_extension
    extension_built: bool | None  # None: not attempted (no native code) or unknown
    extension_called: bool | None  # a built extension's function ran during forward
    # "api_drift" | "submission_bug" | "toolchain" (read like the machine's failure) | "toolchain_unconfirmed" (read
    # so, but a probe extension built on this machine) | "timeout"
    error_class: str | None = None
    error: str = ""
    triton: bool = False
    custom_kernels_seen: tuple[str, ...] = ()  # GPU profiler: kernels the submission defines that ran
    triton_kernels_run: int | None = None  # the candidate's triton kernels compiled in its run (None: unknown)


@dataclass(frozen=True)
class Verdict:
    task: str  # task key (level/name@hash)
    task_name: str
    level: int | None
    problem_id: int | None
    submission: str  # submission id (file name or corpus id)
    submission_sha256: str
    protocol: str
    protocol_sha256: str
    status: Status
    warnings: tuple[str, ...] = ()
    message: str = ""
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    speed_class: str | None = None  # faster | slower | same | ambiguous
    ref_time_ms: float | None = None
    cand_time_ms: float | None = None
    sets: tuple[SetResult, ...] = ()
    timing: dict = field(default_factory=dict)  # raw samples and timing-guard evidence
    build: BuildRecord | None = None
    reproducer: dict = field(default_factory=dict)
    hidden_shapes: str = "none"  # committed | generated | none
    claimed_speedup: float | None = None
    sample: int = 0
    provenance: dict = field(default_factory=dict)
    elapsed_s: float = 0.0
    # wall seconds of each kind of worker process, summed over its runs (candidate and judge overlap in time)
    worker_s: dict = field(default_factory=dict)
    # How the processes that ran submission code were confined (kbverify.harness.confine): "isolated", or "degraded" when
    # any ran unconfined (then nothing kept it from the parent, the judge or their files). The default is for a
    # record without the field: nothing in it shows that its submission code was confined.
    isolation: str = "degraded"
    isolation_reason: str = "recorded before submission code was confined"
    # The entry's labels (`kbverify.core.labels`: a generic JSONL's extra fields, e.g. {"model": "gpt-4o"}): part of
    # what tells two verdicts of one task and sample apart, and what `--group-by` splits the tables by.
    labels: dict = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.status is Status.PASSED

    def to_dict(self) -> dict:
        return {"format_version": RECORD_VERSION, **_plain(dataclasses.asdict(self))}

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        """A verdict from its record, of any format version up to RECORD_VERSION (none: version 0)."""
        data = dict(data)
        version = data.pop("format_version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= RECORD_VERSION:
            raise ValueError(f"verdict record format_version {version!r}: this kbverify reads 0 to {RECORD_VERSION}")
        data["status"] = Status(data["status"])
        data["warnings"] = tuple(data.get("warnings", ()))
        if data.get("speedup_ci") is not None:
            data["speedup_ci"] = tuple(data["speedup_ci"])
        data["sets"] = tuple(
            SetResult(**{**s, "status": Status(s["status"])}) for s in data.get("sets", ())
        )
        if data.get("build") is not None:
            build = dict(data["build"])
            build["custom_kernels_seen"] = tuple(build.get("custom_kernels_seen", ()))
            data["build"] = BuildRecord(**build)
        known = {f.name for f in dataclasses.fields(cls)}
        verdict = cls(**{k: v for k, v in data.items() if k in known})
        _check_types(verdict)
        return verdict


# What score, report and rejudge compare and print: a stored record whose values have another type would fail far
# from the store (a comparison of a string with a float), so it fails here, where it is named as damaged.
_TEXT = ("task", "task_name", "submission", "protocol", "message")
_NUMBERS = ("speedup", "ref_time_ms", "cand_time_ms", "claimed_speedup")
_INTEGERS = ("level", "problem_id")
_OBJECTS = ("timing", "reproducer", "provenance", "worker_s", "labels")


def _check_types(verdict: "Verdict") -> None:
    def wrong(name: str, expected: str):
        return TypeError(f"{name} is {getattr(verdict, name)!r}, not {expected}")

    for name in _TEXT:
        if not isinstance(getattr(verdict, name), str):
            raise wrong(name, "a string")
    for name in _NUMBERS:
        value = getattr(verdict, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise wrong(name, "a number")
    for name in _INTEGERS:
        value = getattr(verdict, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise wrong(name, "an integer")
    if isinstance(verdict.sample, bool) or not isinstance(verdict.sample, int):
        raise wrong("sample", "an integer")
    for name in _OBJECTS:
        if not isinstance(getattr(verdict, name), dict):
            raise wrong(name, "an object")
    if verdict.speedup_ci is not None and (len(verdict.speedup_ci) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in verdict.speedup_ci)):
        raise wrong("speedup_ci", "two numbers")


def _plain(value):
    """asdict leaves enums and tuples; JSON wants strings and lists."""
    if isinstance(value, Status):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value
