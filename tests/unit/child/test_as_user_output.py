"""The script run as a user calls it saves its output in a form `torch.load(weights_only=True)` reads (DRIVER's
`plain`), and the worker rebuilds it (kbverify.worker.as_user.rebuild) so that its structure and tensors read as the
harness's calls read the same value. Corpus: honest/max_values_indices_as_torch_returns_them."""

import collections
import io

import pytest
import torch

from kbverify.core import output_structure
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker import as_user

Pair = collections.namedtuple("Pair", "left right")
Pair.__module__ = "task_abc"  # as the script's random task module names it


def _plain():
    """DRIVER's `plain`, taken from the script's own source."""
    source = as_user.DRIVER.split("CONFIG = @CONFIG@", 1)[1].split("\ntry:", 1)[0]
    namespace = {"torch": torch}
    exec(source, namespace)
    return namespace["plain"]


def _round_trip(value, modules=None):
    buffer = io.BytesIO()
    torch.save(_plain()(value), buffer)
    buffer.seek(0)
    return as_user.rebuild(torch.load(buffer, weights_only=True), modules or {})


X = torch.arange(24.0).reshape(2, 3, 4)
VALUES = {
    "max with dim": torch.max(X, dim=1),
    "sort": torch.sort(X, dim=-1),
    "topk": torch.topk(X, 2),
    "linalg.slogdet": torch.linalg.slogdet(torch.eye(3) * 2),
    "a tensor": X,
    "a tuple of a list and a dict": (X, [X[0], 2.5], {"b": X[1], "a": None}),
    "a structseq in a list": [torch.min(X, dim=0), "label"],
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_an_output_reads_back_as_the_harness_describes_and_flattens_it(name):
    value = VALUES[name]
    back = _round_trip(value)
    assert output_structure.describe(back) == output_structure.describe(value)
    flat, expected = flatten_outputs(back), flatten_outputs(value)
    assert len(flat) == len(expected)
    for got, want in zip(flat, expected):
        assert type(got) is type(want)
        assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want


def test_a_structseq_is_named_by_its_own_type():
    assert output_structure.describe(_round_trip(torch.max(X, dim=1))) == "type:torch.return_types.max"


def test_a_task_namedtuple_is_named_by_the_harness_module_of_the_task():
    back = _round_trip(Pair(X, X), {"task_abc": "kbverify_task_pairs"})
    assert output_structure.describe(back) == "type:kbverify_task_pairs.Pair"
    assert len(flatten_outputs(back)) == 2


def test_an_object_that_is_no_tensor_reads_back_by_its_type_name():
    back = _round_trip([X, range(3)])
    assert output_structure.describe(back) == ["list", ["tensor", "type:builtins.range"]]
    assert type(flatten_outputs(back)[1]).__name__ == "range"


@pytest.mark.parametrize("saved", [["tuple", None], ["set", None, []], ["object", None, []], ["list", [1, 2], []],
                                   {"a": 1}])
def test_a_form_the_script_does_not_write_is_refused(saved):
    with pytest.raises((ValueError, TypeError)):
        as_user.rebuild(saved, {})


def test_an_output_with_too_many_parts_is_refused():
    with pytest.raises(ValueError, match="parts"):
        as_user.rebuild(["list", None, [1] * 10], {}, budget=[5])


def test_names_are_fresh_each_run_and_the_script_names_nothing_of_the_harness():
    first, second = as_user.fresh_names(), as_user.fresh_names()
    assert len(set(first.values())) == len(first)
    assert not set(first.values()) & set(second.values())
    assert "kbverify" not in as_user.DRIVER.lower()
