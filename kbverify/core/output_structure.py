"""The structure of a forward's output, compared between the reference and the candidate.

The judge compares tensors one by one after flattening containers (`kbverify.judge.correctness.flatten_outputs`), so a
tensor returned in a list, a tuple returned as a list, a dict with other keys, or a Python float returned as a
0-d tensor would read as the same answer; a caller doing `model(x).sum()` or `out["logits"]` breaks all the same.
The rule: the candidate's containers (exact type, length, keys) and leaf kinds (a tensor, a Python scalar of its
type, anything else by its type) must be the reference's; a difference is `shape_mismatch`, its evidence naming
the path and what differs (corpus: exploits/relu_returns_a_list_that_answers_like_a_tensor). Each tensor's shape
and dtype are compared with its values (kbverify.judge.correctness). Pure: the workers describe (`describe`), the
parent compares (`difference`), so a stored record is judged again the same way.
"""

from __future__ import annotations

NODE_BUDGET = 256  # beyond this many nodes a container is described by its type and length alone
_SCALARS = (bool, int, float, complex)


def describe(output, budget: list | None = None):
    """A JSON-able description: "tensor", "py:<type>" for a Python scalar or None, ["list"|"tuple", [items]],
    ["dict", [[repr(key), item], ...]] sorted by key, "type:<module.qualname>" for anything else (a subclass of a
    container included: its own methods are not called), ["<kind>", length] where the budget ran out."""
    import torch

    budget = budget if budget is not None else [NODE_BUDGET]
    budget[0] -= 1
    kind = type(output)
    if isinstance(output, torch.Tensor):
        return "tensor"
    if kind in _SCALARS or output is None:
        return f"py:{kind.__name__}"
    if kind in (list, tuple, dict):
        if budget[0] <= 0:
            return [kind.__name__, len(output)]
        if kind is dict:
            items = sorted(((repr(key), value) for key, value in output.items()), key=lambda pair: pair[0])
            return ["dict", [[key, describe(value, budget)] for key, value in items]]
        return [kind.__name__, [describe(item, budget) for item in output]]
    return f"type:{kind.__module__}.{kind.__qualname__}"


def difference(reference, candidate, path: str = "the output") -> str | None:
    """Where the candidate's structure differs from the reference's, in words, or None. Either description
    missing (a record made before structures were kept) is no evidence."""
    if reference is None or candidate is None:
        return None
    if _kind(reference) != _kind(candidate):
        return f"{path}: expected {_words(reference)}, got {_words(candidate)}"
    if not isinstance(reference, list):
        return None
    ref_items, cand_items = reference[1], candidate[1]
    if isinstance(ref_items, int) or isinstance(cand_items, int):  # described by length alone
        return None if _length(reference) == _length(candidate) else \
            f"{path}: expected {_words(reference)}, got {_words(candidate)}"
    if reference[0] == "dict":
        return _dict_difference(dict(map(tuple, ref_items)), dict(map(tuple, cand_items)), path)
    if len(ref_items) != len(cand_items):
        return f"{path}: expected {_words(reference)}, got {_words(candidate)}"
    for index, (ref_item, cand_item) in enumerate(zip(ref_items, cand_items)):
        found = difference(ref_item, cand_item, f"{path}[{index}]")
        if found:
            return found
    return None


def _dict_difference(reference: dict, candidate: dict, path: str) -> str | None:
    missing, extra = sorted(set(reference) - set(candidate)), sorted(set(candidate) - set(reference))
    if missing or extra:
        return (f"{path}: a dict whose keys differ (missing {', '.join(missing) or 'none'}; "
                f"extra {', '.join(extra) or 'none'})")
    for key in reference:
        found = difference(reference[key], candidate[key], f"{path}[{key}]")
        if found:
            return found
    return None


def _kind(description) -> str:
    return description[0] if isinstance(description, list) else str(description)


def _length(description) -> int:
    items = description[1]
    return items if isinstance(items, int) else len(items)


def _words(description) -> str:
    if isinstance(description, list):
        return f"a {description[0]} of {_length(description)}"
    text = str(description)
    if text == "tensor":
        return "a tensor"
    if text.startswith("py:"):
        return f"a Python {text[3:]}"
    return f"an object of type {text.removeprefix('type:')}"
