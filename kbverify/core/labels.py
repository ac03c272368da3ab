"""Labels: the extra fields of a generic JSONL row (e.g. `"model": "gpt-4o"`), kept with its entry and verdicts.

A label is any top-level key a format does not define whose value is a short string, an integer or a boolean.
Labels tell entries apart: two rows for the same task and sample are two entries when their labels differ (two
models' kernels for one task), so the labels are part of what a store and fast_p's one-sample-per-task rule key
on. `--group-by FIELD` (`kbverify.report.leaderboard`) splits the tables by one label's value.
"""

from __future__ import annotations

import re

from kbverify.core.errors import InputError

FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
MAX_VALUE_CHARS = 200
MAX_LABELS = 16

Labels = tuple[tuple[str, str], ...]  # sorted (field, value) pairs: hashable, so entries stay frozen and hashable


def from_row(row: dict, known: set[str] | frozenset[str], where: str) -> Labels:
    """The labels of one JSON object: its keys outside `known` with a scalar value. Nested values and long texts
    (notes, logs) are not labels; too many labels is refused, since each one splits the tables."""
    pairs = []
    for key, value in row.items():
        if key in known or not FIELD.match(str(key)):
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int):
            value = str(value)
        elif not isinstance(value, str) or not value or len(value) > MAX_VALUE_CHARS:
            continue
        pairs.append((str(key), value))
    if len(pairs) > MAX_LABELS:
        raise InputError(f"{where}: {len(pairs)} extra fields ({', '.join(k for k, _ in pairs[:5])}, ...); at most "
                         f"{MAX_LABELS} are kept as labels")
    return tuple(sorted(pairs))


def key(labels) -> str:
    """One string for a set of labels ("" for none): `model=a,temp=0`."""
    items = labels.items() if isinstance(labels, dict) else labels
    return ",".join(f"{name}={value}" for name, value in sorted(items or ()))


def require_field(field: str, seen: list[dict], what: str) -> None:
    """InputError unless some label set in `seen` has `field`, naming the fields there are."""
    if any(field in labels for labels in seen):
        return
    fields = sorted({name for labels in seen for name in labels})
    there = f"its fields: {', '.join(fields)}" if fields else "it has no extra fields (e.g. \"model\": \"...\")"
    raise InputError(f"--group-by {field}: no entry of {what} has the field {field!r}; {there}")
