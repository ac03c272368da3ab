"""Evidence with a known origin: what the judge decides from (SPEC §4). Pure: no torch, no processes.

A verdict is only as trustworthy as the origin of its evidence, so every record the judge reads says where it
came from, and nobody edits it after it was made:
- `observed`: measured by the parent itself (its clocks, the hand-over folder's listing, exit codes, the GPU's
  processes);
- `computed`: by a process that never ran submission code (the reference, float64, the check of timed outputs);
- `claimed`: by a process that ran submission code, whatever it says of itself;
- `infrastructure`: kbverify's own failure (its out of memory, a mount, a missing module, no compiler).

Which of `computed` and `claimed` a child's record is follows from the parent's own knowledge of whether the
process ran submission code (`ChildOutcome.ran_submission`), never from the record. A claim can make a kernel fail
or its verdict `unverifiable`; only observed and computed facts can make it pass. Records are validated once,
where they cross the channel (`from_child`): a claimed record that is not one the harness writes is itself
evidence against the candidate (`malformed`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

EVIDENCE_VERSION = 1


class Origin(str, enum.Enum):
    OBSERVED = "observed"
    COMPUTED = "computed"
    CLAIMED = "claimed"
    INFRASTRUCTURE = "infrastructure"


def frozen(value):
    """A read-only deep copy of a JSON-like value: mappings become mapping proxies, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(item) for item in value)
    return value


def thawed(value):
    """The plain JSON-like copy of a frozen value (for a store or a report)."""
    if isinstance(value, Mapping):
        return {key: thawed(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thawed(item) for item in value]
    return value


@dataclass(frozen=True)
class Evidence:
    """One record and where it came from. `facts` is read-only all the way down; `malformed` names what of a
    child's record is not what the harness writes ("" when it is)."""

    origin: Origin
    source: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    malformed: str = ""
    version: int = EVIDENCE_VERSION

    def __post_init__(self):
        if not isinstance(self.facts, MappingProxyType):
            object.__setattr__(self, "facts", frozen(dict(self.facts or {})))

    def get(self, key: str, default=None):
        return self.facts.get(key, default)

    def __getitem__(self, key: str):
        return self.facts[key]

    def __contains__(self, key: str) -> bool:
        return key in self.facts

    def plain(self) -> dict:
        """A plain deep copy of the facts, for code that reads dicts and lists: the record itself stays as made."""
        return thawed(self.facts)


def observed(source: str, facts: Mapping) -> Evidence:
    return Evidence(Origin.OBSERVED, source, facts)


def from_child(record: Mapping | None, *, ran_submission: bool, source: str, schema: Mapping) -> Evidence:
    """A child's record as evidence: claimed if its process ran submission code, computed otherwise; checked
    against `schema` (key → the types its value may have) once, here."""
    origin = Origin.CLAIMED if ran_submission else Origin.COMPUTED
    record = record if isinstance(record, Mapping) else {}
    return Evidence(origin, source, record, malformed=_malformed(record, schema))


def _malformed(record: Mapping, schema: Mapping) -> str:
    wrong = []
    for key, types in schema.items():
        if key in record and record[key] is not None and not _has_type(record[key], types):
            wrong.append(f"{key} is a {type(record[key]).__name__}")
    return "; ".join(wrong)


def _has_type(value, types) -> bool:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return False  # a bool is an int to isinstance, never to a record
    return isinstance(value, types)


# What the isolated protocols' workers write at the top level of their records (kbverify.worker.evaluate):
# checked where the record crosses into the parent.
CANDIDATE_SCHEMA = {"sets": dict, "warnings": list, "refused": list, "tampered": list, "load_error": str,
                    "threads_started": int, "quietly_refused": (list, bool), "extensions": dict}
JUDGE_SCHEMA = {"sets": dict}
TIMING_SCHEMA = {"refused": list, "tampered": list, "error": str, "load_error": str, "error_side": str,
                 "warnings": list, "flags_changed": list, "torch_functions_changed": list, "n_unsettled": int,
                 "settle_gaps_ms": dict, "threads_started": dict, "uncovered_calls": dict, "host_ms": dict}

# Where each part of a verified timing record comes from; the rounds hold the worker's times as the parent
# received them and the parent's own clock around each batch.
TIMING_ORIGINS = {"interleaved": "claimed", "reference_worker": "computed", "rounds": "observed",
                  "timed_outputs": "computed",
                  "clean_reference": "computed", "noise_margin": "computed", "gpu_processes": "observed"}
