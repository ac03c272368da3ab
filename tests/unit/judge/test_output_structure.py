"""The output's structure is part of its answer (kbverify.core.output_structure): containers, lengths, keys and leaf
kinds must be the reference's, and a difference is `shape_mismatch` naming what differs. Corpus:
exploits/relu_returns_a_list_that_answers_like_a_tensor, honest/relu_row_blocks_concatenated."""

import torch

from kbverify.core.output_structure import describe, difference
from kbverify.core.protocols import VERIFIED
from kbverify.core.status import Status
from kbverify.judge import decide_set

Y = torch.ones(3)


def test_the_same_structure_is_no_difference():
    for output in (Y, (Y, Y), [Y, 2.0], {"a": Y, "b": (Y, None)}, torch.tensor(1.0)):
        assert difference(describe(output), describe(output)) is None


def test_each_kind_of_difference_is_named():
    assert difference(describe(Y), describe([Y])) == "the output: expected a tensor, got a list of 1"
    assert "expected a tuple of 2, got a list of 2" in difference(describe((Y, Y)), describe([Y, Y]))
    assert "expected a tuple of 2, got a tuple of 3" in difference(describe((Y, Y)), describe((Y, Y, Y)))
    assert "missing 'b'; extra 'c'" in difference(describe({"a": Y, "b": Y}), describe({"a": Y, "c": Y}))
    assert "expected a tensor, got a Python float" in difference(describe(torch.tensor(1.0)), describe(1.0))
    assert difference(describe([Y, (Y, 1)]), describe([Y, (Y, Y)])).startswith("the output[1][1]:")


def test_a_container_subclass_is_not_its_base_and_is_not_walked():
    class Quacks(list):
        def __iter__(self):
            raise AssertionError("never called")

    assert "got an object of type" in difference(describe(Y), describe(Quacks([Y])))


def test_a_huge_container_is_described_by_its_length():
    assert difference(describe([Y] * 1000), describe([Y] * 1000)) is None
    assert "a list of 999" in difference(describe([Y] * 1000), describe([Y] * 999))


def test_a_record_without_a_structure_is_no_evidence():
    assert difference(None, describe([Y])) is None and difference(describe(Y), None) is None


def test_decide_set_reads_a_structure_difference_as_shape_mismatch():
    ref = {"valid": True, "ref_structure": describe(Y), "comparison": {"outputs": []}}
    cand = {"outputs": {"lazy": [], "no_storage": [], "aliases_input": []}, "mutated_inputs": [],
            "structure": describe([Y])}
    status, detail = decide_set(cand, ref, VERIFIED, {})
    assert status is Status.SHAPE_MISMATCH and "expected a tensor, got a list of 1" in detail
