"""Known KernelBench reference versions: is a shipped reference one of them, or was it modified?

A published run may ship its own reference (`ref_code`). It is untrusted: a reference edited to be easier (smaller
shapes, a cheaper op) inflates every speedup scored against it. Each reference is reduced to a normalised form
(the syntax tree without docstrings, comments or formatting) and hashed; the hashes of every known KernelBench
version of each task are committed in `data/kernelbench_reference_hashes.json`
(built by `scripts/build_reference_hashes.py` from a local KernelBench checkout).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from importlib import resources

DATA_FILE = "kernelbench_reference_hashes.json"
# Bump when the normalisation changes: hashes made by another version are not comparable.
NORMALIZATION_VERSION = 1


def reference_key(level: int, problem_id: int) -> str:
    return f"level{level}/{problem_id}"


def normalized_hash(source: str) -> str | None:
    """SHA-256 of the normalised syntax tree of `source`; None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()


def _canonical(node) -> str:
    """A serialisation of the tree that is the same on Python 3.10–3.13.

    `ast.dump` is not: 3.12 added `type_params`, 3.13 stopped printing empty fields. Empty and None fields are
    therefore left out, and string statements (docstrings, and bare strings used as comments) are dropped.
    """
    if isinstance(node, ast.AST):
        parts = []
        for name, value in ast.iter_fields(node):
            if name in ("kind", "type_comment"):
                continue
            if isinstance(value, list):
                value = [item for item in value if not _is_string_statement(item)]
            if value is None or value == []:
                continue
            parts.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({','.join(parts)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    return repr(node)


def _is_string_statement(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


@functools.cache
def _load() -> dict:
    text = resources.files("kbverify").joinpath("data", DATA_FILE).read_text()
    data = json.loads(text)
    if data.get("normalization_version") != NORMALIZATION_VERSION:
        # Stale data would flag every reference as modified; treat it as absent instead.
        return {}
    return data["tasks"]


def known_versions(level: int, problem_id: int) -> dict[str, tuple[str, ...]] | None:
    """Normalised hash → where that version is found (branch names or `branch@commit`); None when no data."""
    versions = _load().get(reference_key(level, problem_id))
    if versions is None:
        return None
    return {digest: tuple(labels) for digest, labels in versions.items()}


def matching_versions(level: int, problem_id: int, source: str) -> tuple[str, ...] | None:
    """The known versions `source` is identical to (empty when modified); None when there is no data for the id."""
    versions = known_versions(level, problem_id)
    if versions is None:
        return None
    return versions.get(normalized_hash(source), ())


def is_known_reference(level: int, problem_id: int, source: str) -> bool | None:
    """True when `source` is a known KernelBench version of the task; None when there is no data for that id."""
    found = matching_versions(level, problem_id, source)
    return None if found is None else bool(found)
